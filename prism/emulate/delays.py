"""The emulation's own delay per op kind, computed once: what the summary, the report and `prism sql` show.

The replay worker records every real exchange (a comm between a sandbox rank and replayed ones) as it completes:
when, and the last virtual member's arrival at it then (``raw/replay/exchanges.arrow``,
`prism.schemas.RAW_EXCHANGES`). With the sandbox's own arrivals (its measured issues: the 'sandbox' rows of
``emulation/events.parquet``), each exchange's model completion is the clock rule's (`prism.clock_rule`) for the
arrivals as they happened, every member's: a collective its calibrated transfer after the last arrival, a
message max(the recv's arrival, the send's + the transfer). How late the exchange completed against it is the
emulation's own lateness (its replay and transport running late in wall-clock time), not the program's: a
sandbox that computes slower arrives later, and the model's completion moves with it.

`delays_table` gives, per op kind, how many exchanges (`n`), how late at the median, p95, max and mean, the
lateness past the model summed over an iteration's exchanges (mean over the iterations the figures time,
`prism.emulate.results`), and the same exchanges against the calibrated timeline's completion for contrast (a
shift accumulated over the run, which the program's behaviour moves too; `prism.schemas.EMULATION_DELAYS`). The emulate stage writes it as
``emulation/delays.parquet`` (`prism sql`'s ``emulation.delays``); `text_lines` is what the summary prints and
the report shows. These delays are per exchange, not per rank: a comm that several sandbox ranks share is one
exchange, measured once, on the worker's side.

Meta.json's ``emulation.cone.exchange_late_by_op`` (`TimedReplay.exchange_delays`) has the same exchanges with the
virtual arrivals only (``vs_model``): that one also counts a sandbox member arriving after its replayed peers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from prism import artifacts, schemas
from prism import job as job_files
from prism.clock_rule import NEG, collective_done, p2p_done

FILE = "delays.parquet"
NO_EXCHANGES = "no real exchanges (the sandbox ranks exchanged nothing with replayed ranks)"


def _strings(column) -> list[str]:
    return column.cast(pa.string()).to_pylist() if pa.types.is_dictionary(column.type) else column.to_pylist()


def sandbox_arrivals(events: pa.Table) -> dict[str, np.ndarray]:
    """The sandbox ranks' arrivals at their comms: their issue events (collective, send, recv) among `events`
    (the emulation's events: rows of source 'sandbox'), as arrays comm_id, kind, start_ns."""
    source, kind = np.asarray(_strings(events["source"])), np.asarray(_strings(events["kind"]))
    comm = events["comm_id"].to_numpy()
    keep = (source == "sandbox") & np.isin(kind, schemas.COMM_KINDS) & (comm >= 0)
    return {"comm_id": comm[keep].astype(np.int64), "kind": kind[keep],
            "start_ns": events["start_ns"].to_numpy()[keep].astype(np.int64)}


def lateness(exchanges: pa.Table, arrivals: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per exchange (a `RAW_EXCHANGES` row), how late it completed (ns): ``late_ns`` against the model's completion
    for every member's arrival (the last virtual one recorded, the sandbox's in `arrivals`; see the module
    docstring), ``vs_calibrated_ns`` against the calibrated completion (NaN: none); with op and iteration."""
    comm = exchanges["comm_id"].to_numpy().astype(np.int64)
    order = np.argsort(comm, kind="stable")
    pos = np.searchsorted(comm[order], arrivals["comm_id"])
    found = pos < len(comm)
    found[found] = comm[order][pos[found]] == arrivals["comm_id"][found]
    at = order[pos[found]]
    kind, start = arrivals["kind"][found], arrivals["start_ns"][found]
    last = {}
    for name in schemas.COMM_KINDS:  # the sandbox's last arrival at each exchange, by its side
        last[name] = np.full(len(comm), NEG, dtype=np.int64)
        np.maximum.at(last[name], at[kind == name], start[kind == name])
    virtual = exchanges["virtual_arrival_ns"].to_numpy().astype(np.int64)
    transfer = exchanges["transfer_ns"].to_numpy().astype(np.int64)
    coll, send, recv = last[schemas.KIND_COLLECTIVE], last[schemas.KIND_SEND], last[schemas.KIND_RECV]
    model = np.where(coll != NEG, collective_done(np.maximum(virtual, coll), transfer),
                     np.where(send != NEG, p2p_done(virtual, send, transfer), p2p_done(recv, virtual, transfer)))
    missing = (coll == NEG) & (send == NEG) & (recv == NEG)
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise artifacts.ArtifactError(
            f"the replay's exchange of comm {int(comm[i])} (iteration {exchanges['iteration'][i].as_py()}) has no "
            "sandbox rank's issue in the emulation's events: the replay worker and the sandbox ran different jobs")
    completed = exchanges["completed_ns"].to_numpy().astype(np.int64)
    calibrated = exchanges["calibrated_completion_ns"]
    vs_calibrated = np.where(calibrated.is_null().to_numpy(zero_copy_only=False), np.nan,
                             completed - calibrated.fill_null(0).to_numpy().astype(np.int64))
    return {"op": np.asarray(_strings(exchanges["op"]), dtype=object),
            "iteration": exchanges["iteration"].to_numpy().astype(np.int64),
            "late_ns": completed - model, "vs_calibrated_ns": vs_calibrated}


def _stats(values_ns: np.ndarray) -> dict[str, float | None]:
    if not len(values_ns):
        return dict.fromkeys(("median", "p95", "max", "mean"))
    ms = np.asarray(values_ns, dtype=np.float64) / 1e6
    return {"median": float(np.median(ms)), "p95": float(np.percentile(ms, 95)), "max": float(ms.max()),
            "mean": float(ms.mean())}


def delays_table(late: dict[str, np.ndarray], iterations: list[int]) -> pa.Table:
    """``emulation/delays.parquet`` (`prism.schemas.EMULATION_DELAYS`) from `lateness`: one row per op kind, by
    name; `iterations`: those every sandbox rank ran for real (`results.compared_iterations`); the lateness per
    iteration is the mean over all of them but the first (the iterations the figures time)."""
    timed = sorted(iterations)[1:]
    rows = []
    for op in sorted(set(late["op"].tolist())):
        mine = late["op"] == op
        row = {"op": op, "n": int(mine.sum()), "iterations": list(iterations)}
        row.update({f"late_{k}_ms": v for k, v in _stats(late["late_ns"][mine]).items()})
        vs_cal = late["vs_calibrated_ns"][mine]
        row.update({f"vs_calibrated_{k}_ms": v for k, v in _stats(vs_cal[~np.isnan(vs_cal)]).items()})
        in_timed = mine & np.isin(late["iteration"], np.asarray(timed, dtype=np.int64))
        row["late_ms_per_iteration"] = (float(np.maximum(late["late_ns"][in_timed], 0).sum()) / 1e6 / len(timed)
                                        if timed else None)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schemas.EMULATION_DELAYS)


def no_exchanges() -> dict[str, np.ndarray]:
    """`lateness` of an emulation without real exchanges."""
    return {"op": np.empty(0, dtype=object), "iteration": np.empty(0, dtype=np.int64),
            "late_ns": np.empty(0, dtype=np.int64), "vs_calibrated_ns": np.empty(0, dtype=np.float64)}


def read_exchanges(out: Path) -> pa.Table | None:
    """The replay worker's real exchanges in a launch's OUT (None: the launch recorded none, e.g. untimed)."""
    path = job_files.replay_stream(out, "exchanges.arrow")
    return artifacts.read_raw_stream(path, schemas.RAW_EXCHANGES) if path.is_file() else None


def from_launch(out: Path, events: pa.Table, iterations: list[int]) -> pa.Table:
    """The delays table of the launch in OUT, the emulation's `events` giving the sandbox's arrivals."""
    exchanges = read_exchanges(out)
    if exchanges is None or not exchanges.num_rows:
        return delays_table(no_exchanges(), iterations)
    return delays_table(lateness(exchanges, sandbox_arrivals(events)), iterations)


def read_delays(job_dir: str | Path) -> pa.Table:
    """The job folder's ``emulation/delays.parquet``."""
    return artifacts.read_parquet(job_files.emulation(job_dir, FILE))


def _ms(v: float | None, width: int) -> str:
    return f"{'n/a':>{width}}" if v is None else f"{v:>{width}.2f}"


def text_lines(table: pa.Table) -> list[str]:
    """The delays as the summary prints them (and the report shows them)."""
    head = (f"emulation's own delay per op kind (emulation/{FILE}; prism sql: emulation.delays): how late each "
            "real exchange with replayed ranks completed against the model for the arrivals as they happened (every "
            "member's, + the calibrated transfer): the emulation running late, not the program (< 0: early)")
    if not table.num_rows:
        return [f"{head}: {NO_EXCHANGES}"]
    timed = sorted(table["iterations"][0].as_py())[1:]
    lines = [head + ":", f"  {'op kind':<24} {'n':>6}  {'late ms: median':>15} {'p95':>8} {'max':>8}  "
                         f"{'ms per iteration':>16}"]
    for r in table.to_pylist():
        lines.append(f"  {r['op']:<24} {r['n']:>6}  {_ms(r['late_median_ms'], 15)} {_ms(r['late_p95_ms'], 8)} "
                     f"{_ms(r['late_max_ms'], 8)}  {_ms(r['late_ms_per_iteration'], 16)}")
    lines.append(f"  (ms per iteration: the lateness past the model summed over an iteration's exchanges, mean over "
                 f"iterations {', '.join(map(str, timed)) or 'none'}; not a split of the emulation delay above: "
                 "exchanges overlap, and one the sandbox did not wait on costs it nothing)")
    return lines


__all__ = ["FILE", "NO_EXCHANGES", "delays_table", "from_launch", "lateness", "no_exchanges", "read_delays",
           "read_exchanges", "sandbox_arrivals", "text_lines"]
