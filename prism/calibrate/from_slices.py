"""Durations and transfers measured in the slice runs, for the calibration sweep.

    prism slices durations --job DIR [--slices slices|slices_timed]
        ->  DIR/<slices>/{durations,transfers}.parquet

`--slices slices_timed` reads the timed pass (`prism.slices.run --timed-by`: the replayed ranks answered at
their calibrated times) and its `replay.parquet`: there a replayed member may issue after the slice's own
members, and a member's delay runs from the last issue of all members, replayed ones included (the
transfer, never the wait for a late peer, which the calibration sweep adds from the peers' own times).

Every event takes its duration from the slice run where its rank ran for real (`slices/slice=K/events.parquet`,
rows aligned with the graph by `event_id`), by the measured-run rule (`durations.measured_run`, the inputs of
`prism.clock_rule`), the rule that is exact on a real run's own measurements (`prism.bench.fidelity_model`:
within 0.23 % on the 60 truth runs of session 16, docs/fidelity.md): compute the longer of its wall span and its
device time (on CUDA the GPU time from CUDA events), ops their issue time; a comm's transfer (last member's
issue to completion, measured without waiting) is its *first* measured member's delay in a slice run, each run
on its own clock (one run's times are never compared with another's), and each member's wait keeps its lag
behind its own slice run's first member as its own time (members of a collective see its completion at
different times -- gloo's ring finishes member by member -- and the group's next op and each member's next
compute wait for that member's view). A comm whose members ran in several slice runs (a collective across
slices) was measured once per run, each an independent sample of the one completion the real job has: its
transfer is the *mean* of the runs' first-member delays, and no member's lag is read across runs. (Until
session 17 it took the smallest and gave every other run's members their excess over it as lag: members whose
real completions lie within 0.1 ms of each other then waited, in the sweep, for the slowest of independent
samples, +21.8 % on tp2dp4: docs/fidelity.md, "Session 17".) A member's delay runs from the last issue of its slice's
members; in a timed pass (`--slices slices_timed`, every slice with its `replay.parquet`) of the replayed members
too, whose issues are known on the slice's clock. An untimed server issues as soon as it can, so there the
virtual members are taken to issue with the slice's own. (Until session 16 an untimed pass took each comm's
mean member delay and compute's CPU time, which on the truths' own inputs ran 0.6-13.8 % low, most on EP
layouts: docs/fidelity.md.)
Ranks whose slice was not measured (the planner's
`--representative`) take the events of the rank of the same ``rank_class`` in the slice that measures
theirs (`representatives`); a comm among such ranks only takes the transfer of the comms their
representatives' events belong to. Comms no slice saw complete otherwise keep the bare graph's transfer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from prism import folder_lock
from prism import job as job_files
from prism import artifacts
from prism.calibrate import durations as rules
from prism.calibrate.arrays import K_COLLECTIVE, K_RECV, K_SEND, K_WAIT
from prism.calibrate.stage import CalibrateError
from prism.job import load_graph

_I64_MIN = np.iinfo(np.int64).min


def _delays(kind, comm, wait_op, t_start, t_end, t_complete, rows: np.ndarray, n_comms: int,
            replayed: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """(measured members, their delays) of one slice run (see `slice_delays`)."""
    is_op = (kind == K_COLLECTIVE) | (kind == K_SEND) | (kind == K_RECV)
    ops = rows[is_op[rows]]
    last_start = np.full(n_comms, _I64_MIN, dtype=np.int64)
    np.maximum.at(last_start, comm[ops], t_start[ops])
    if replayed is not None and len(replayed[0]):
        np.maximum.at(last_start, replayed[0], replayed[1])
    seen = np.full(len(kind), -1, dtype=np.int64)
    counts = ops[kind[ops] != K_SEND]
    seen[counts] = t_complete[counts]
    waits = rows[kind[rows] == K_WAIT]
    target = wait_op[waits]
    ok = (target >= 0) & (kind[np.maximum(target, 0)] != K_SEND)
    seen[target[ok]] = t_end[waits[ok]]
    members = ops[seen[ops] >= 0]
    return members, np.maximum(seen[members] - last_start[comm[members]], 0)


def slice_delays(kind, comm, wait_op, t_start, t_end, t_complete, rows: np.ndarray, n_comms: int,
                 replayed: tuple[np.ndarray, np.ndarray] | None = None):
    """What one slice run (its rows only) measured of each comm: (sum of member delays, members counted).

    A member's delay: from the last issue among the comm's members to when the member saw it complete (its
    wait's end, or its recorded completion without a wait). The members are the slice's, plus, in a timed
    slice run, the replayed ones: `replayed` = (comm, when the replay server issued it) on the slice's clock.
    Sends say nothing (a send completes locally)."""
    members, delay = _delays(kind, comm, wait_op, t_start, t_end, t_complete, rows, n_comms, replayed)
    total = np.zeros(n_comms, dtype=np.int64)
    count = np.zeros(n_comms, dtype=np.int64)
    np.add.at(total, comm[members], delay)
    np.add.at(count, comm[members], 1)
    return total, count


def member_delays(kind, comm, wait_op, t_start, t_end, t_complete, rows: np.ndarray, n_comms: int,
                  replayed: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Per comm, the smallest delay among one slice run's measured members (`slice_delays`' delays): when the
    comm's first member saw it complete, from the last issue (int64 max where none was measured)."""
    members, delay = _delays(kind, comm, wait_op, t_start, t_end, t_complete, rows, n_comms, replayed)
    out = np.full(n_comms, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(out, comm[members], delay)
    return out


def _replayed(path: Path, comm_position: dict[int, int]) -> tuple[np.ndarray, np.ndarray] | None:
    """A timed slice's replay issues as (comm index, t_issue_ns); None for an untimed slice (no file)."""
    if not path.is_file():
        return None
    table = artifacts.read_parquet(path, columns=["comm_id", "t_issue_ns"])
    try:
        index = np.array([comm_position[int(c)] for c in table["comm_id"].to_numpy()], dtype=np.int64)
    except KeyError as exc:
        raise CalibrateError(f"{path}: comm_id {exc.args[0]} is not in the graph: the slice comes from another "
                             "capture; re-run the slices") from None
    return index, table["t_issue_ns"].to_numpy().astype(np.int64)


def representatives(plan: list[dict], source: str | Path = "slices/plan.parquet") -> dict[int, int]:
    """For every rank of an unmeasured slice, the rank whose measurement it takes: the rank of the same
    ``rank_class`` in the slice that measures its slice (``measured_by``). Several ranks of one class in a
    slice pair up in rank order. `plan` holds the rows of ``slices/plan.parquet`` (`source`, for messages).

    A plan whose unmeasured slice has a class its measuring slice lacks (or fewer ranks of it) is an
    error: its slices are not equivalent."""
    members: dict[int, dict[str, list[int]]] = {}
    for row in plan:
        members.setdefault(row["slice"], {}).setdefault(row["rank_class"], []).append(row["rank"])
    measured_by = {row["slice"]: row["measured_by"] for row in plan}
    out: dict[int, int] = {}
    for k, by_class in sorted(members.items()):
        m = measured_by[k]
        if m == k:
            continue
        if m not in members:
            raise CalibrateError(f"{source}: slice {k} is measured by slice {m}, which the plan does "
                                 "not hold; plan again")
        for cls, ranks in sorted(by_class.items()):
            src = sorted(members[m].get(cls, []))
            if len(src) != len(ranks):
                raise CalibrateError(
                    f"{source}: slice {k} has {len(ranks)} rank(s) of class {cls!r}, the slice measuring "
                    f"it ({m}) has {len(src)}: these slices are not equivalent; plan again")
            out.update(zip(sorted(ranks), src))
    return out


def _borrowed_transfers(comm: np.ndarray, source: np.ndarray, known: np.ndarray, transfer: np.ndarray) -> np.ndarray:
    """`transfer` where a comm no slice measured takes the mean transfer of the measured comms its
    members' source events belong to (a comm among borrowed ranks only: its members' measurement is their
    representatives'). Comms without such a source keep their value."""
    members = np.flatnonzero((source >= 0) & (comm >= 0))
    c_dst, c_src = comm[members], comm[source[members]]
    use = ~known[c_dst] & (c_src >= 0)
    use[use] &= known[c_src[use]]
    total = np.zeros(len(transfer), dtype=np.int64)
    count = np.zeros(len(transfer), dtype=np.int64)
    np.add.at(total, c_dst[use], transfer[c_src[use]])
    np.add.at(count, c_dst[use], 1)
    out = transfer.copy()
    got = count > 0
    out[got] = total[got] // count[got]
    return out


def from_slices(job_dir: str | Path, slices_dir: str = "slices") -> tuple[pa.Table, pa.Table]:
    """Durations and transfers of the slice runs under JOB/<slices_dir>/slice=K (the plan: JOB/slices)."""
    job_dir = Path(job_dir)
    job = load_graph(job_dir)
    comm_position = {int(c): i for i, c in enumerate(job.comm_ids)}
    g, c = job.graph, job.columns
    n = len(job.event_ids)
    position = {int(e): i for i, e in enumerate(job.event_ids)}
    plan = artifacts.read_parquet(job_files.slice_plan(job_dir)).to_pylist()
    device, cpu = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    t_start, t_end, t_complete = (np.full(n, -1, dtype=np.int64) for _ in range(3))
    measured = np.zeros(n, dtype=bool)
    transfer = rules.bare_graph(g.kind, g.comm, g.wait_op, c["own_ns"], c["t_start_ns"],
                                c["t_end_ns"], c["t_complete_ns"], g.n_comms)[1]
    none = np.iinfo(np.int64).max
    first_sum = np.zeros(g.n_comms, dtype=np.int64)  # the slice runs' first-member delays: their sum and count
    first_count = np.zeros(g.n_comms, dtype=np.int64)
    runs = []  # per measured slice: its rows, its replayed issues (a timed slice), its first-member delays
    slices = sorted({row["slice"] for row in plan if row["measured"]})
    for k in slices:
        path = job_files.slice_file(job_dir, k, folder=slices_dir)
        if not path.is_file():
            untimed = job_files.calibrated(job_dir, "timeline", job_files.UNTIMED_CALIBRATION)
            timed = f" --timed-by {untimed}" if slices_dir != job_files.SLICES else ""
            raise CalibrateError(f"{path} is missing: run slice {k} (prism slices run --job "
                                 f"{job_dir} --slice {k}{timed})")
        ev = artifacts.read_parquet(path, columns=["event_id", "device_ns", "cpu_ns", "t_start_ns", "t_end_ns",
                                                   "t_complete_ns"])
        bad = np.flatnonzero((ev["device_ns"].to_numpy() < -1) | (ev["cpu_ns"].to_numpy() < -1)
                             | (ev["t_end_ns"].to_numpy() < ev["t_start_ns"].to_numpy()))
        if len(bad):
            i = int(bad[0])
            raise CalibrateError(f"{path}: event_id {ev['event_id'][i]} has a negative duration "
                                 f"({len(bad)} such events): the slice run's recorder is broken; re-run the slice")
        try:
            rows = np.array([position[int(e)] for e in ev["event_id"].to_numpy()], dtype=np.int64)
        except KeyError as exc:
            raise CalibrateError(f"{path}: event_id {exc.args[0]} is not in {job_files.graph_dir(job_dir)}: the slice "
                                 "comes from another capture; re-run the slices") from None
        for name, dest in (("device_ns", device), ("cpu_ns", cpu), ("t_start_ns", t_start), ("t_end_ns", t_end),
                           ("t_complete_ns", t_complete)):
            dest[rows] = ev[name].to_numpy()
        measured[rows] = True
        replayed = _replayed(path.with_name("replay.parquet"), comm_position)
        firsts = member_delays(g.kind, g.comm, g.wait_op, t_start, t_end, t_complete, rows, g.n_comms, replayed)
        seen = firsts != none
        first_sum[seen] += firsts[seen]
        first_count[seen] += 1
        runs.append((rows, replayed, firsts))
    # ranks of unmeasured slices borrow the events of the rank of their class in the slice measuring theirs
    ranks = np.asarray(job.rank)
    classes = {row["rank"]: row["rank_class"] for row in plan}
    source = np.full(n, -1, dtype=np.int64)  # a borrowed event's source event
    for dst, src in representatives(plan, job_files.slice_plan(job_dir)).items():
        dst_rows = np.flatnonzero(ranks == dst)
        src_rows = np.flatnonzero(ranks == src)
        if len(dst_rows) != len(src_rows):
            raise CalibrateError(f"rank {dst} and rank {src} (class {classes[dst]!r}) have different event "
                                 "counts: the plan's rank classes do not fit this graph; plan again (prism slices "
                                 f"plan --job {job_dir} ...) or plan without --representative")
        measured[dst_rows] = measured[src_rows]
        source[dst_rows] = src_rows
    if not measured.all():
        missing = int(np.flatnonzero(~measured)[0])
        raise CalibrateError(f"event {int(job.event_ids[missing])} of rank {int(ranks[missing])} was measured "
                             "by no slice: the plan does not cover every rank")
    own = rules.own_ns(g.kind, device, cpu)
    known = first_count > 0  # some slice measured a member of it
    transfer[known] = first_sum[known] // first_count[known]
    # each slice's events by the measured-run rule, on that slice's clock: a member's delay runs from the last
    # issue of the slice's members, and in a timed pass of the replayed members too (`replay.parquet`). An
    # untimed server issues as soon as it can, so the job's virtual members are taken to issue with the slice's
    # (what the server's own queue adds, e.g. a ring's ops in turn, stays in the delay, as gloo's queue does in
    # the job; docs/fidelity.md, session 16). A member's lag is behind its own run's first member (session 17)
    dur = np.zeros(n, dtype=np.int64)
    for rows, replayed, firsts in runs:
        keep = np.zeros(n, dtype=bool)
        keep[rows] = True
        ts, te, tc = (np.where(keep, a, -1) for a in (t_start, t_end, t_complete))
        own_first = np.where(firsts != none, firsts, transfer)
        part, _ = rules.measured_run(g.kind, g.comm, g.wait_op, own, ts, te, tc, g.n_comms, transfer=own_first,
                                     issues=replayed)
        dur[rows] = part[rows]
    borrowed = source >= 0
    dur[borrowed] = dur[source[borrowed]]
    transfer[:] = _borrowed_transfers(g.comm, source, known, transfer)
    return _tables(job, dur, transfer)


def _tables(job, dur: np.ndarray, transfer: np.ndarray) -> tuple[pa.Table, pa.Table]:
    durations = pa.table({"event_id": pa.array(job.event_ids, pa.int64()), "duration_ns": pa.array(dur, pa.int64())})
    transfers = pa.table({"comm_id": pa.array(job.comm_ids, pa.int64()), "transfer_ns": pa.array(transfer, pa.int64())})
    return durations, transfers


def inputs(job_dir: Path, slices_dir: str = "slices") -> list[Path]:
    """The artifacts the durations come from (which must share one run): the graph, the plan, and the
    events of every measured slice."""
    plan = job_files.slice_plan(job_dir)
    slices = sorted({r["slice"] for r in artifacts.read_parquet(plan, columns=["slice", "measured"]).to_pylist()
                     if r["measured"]})
    found = [job_files.slice_file(job_dir, k, name, slices_dir) for k in slices for name in ("events.parquet", "replay.parquet")]
    return [job_files.graph_file(job_dir, "events"), job_files.graph_file(job_dir, "comms"), plan,
            *(p for p in found if p.is_file())]


@folder_lock.locks_job("prism slices durations")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism slices durations", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--slices", default="slices", choices=("slices", "slices_timed"),
                        help="which pass's slice runs: untimed (slices) or timed by the first calibration")
    args = parser.parse_args(argv)
    try:
        run_id = artifacts.same_run(inputs(args.job, args.slices))
        durations, transfers = from_slices(args.job, args.slices)
        schema = {"durations": durations.schema, "transfers": transfers.schema}
        artifacts.write_outputs(args.job / args.slices, {"durations": durations, "transfers": transfers}, schema,
                                run_id=run_id)
    except (CalibrateError, artifacts.ArtifactError) as exc:
        print(f"prism calibrate from_slices: error: {exc}", file=sys.stderr)
        return 2
    print(f"prism calibrate from_slices: {durations.num_rows} event durations, {transfers.num_rows} transfers "
          f"-> {args.job / args.slices}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
