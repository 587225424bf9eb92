"""What a slice run's replay server played, op by op, against what the slice ranks measured (issue 24 (b), 25).

The server (`prism.runtime.slice.replay_server`) writes `raw/replay/ops.arrow`: per op with a slice rank, when
it could have issued the virtual members' part (`t_ready_ns`), when its first issue call began and its last
returned (`t_issue_ns`, `t_issued_ns`), and when it saw their part complete (`t_complete_ns`), on the host
monotonic clock, the slice ranks' clock too. `with_comm_ids` gives each row the graph's comm (from the slice
ranks' own events: a collective by group and sequence, a message by its channel and index), and the slice
stage writes it as `slices/slice=K/replay_ops.parquet` (`schemas.SLICE_REPLAY_OPS`).

`lateness` says, per op kind and group size, whether the server's part entered what the slice measured: a
member's measured delay runs from the last *slice* member's issue (`prism.calibrate.from_slices`), so where the
server issued after that, the difference is the server's time, not the transfer's (`late_ms`); `turnaround_ms`
is its own issue time (last call returned - ready); `delay_ms` the members' measured delay as from_slices takes
it (to the first member that saw the completion).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from prism import schemas


def _strings(col: pa.ChunkedArray) -> list:
    return (col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col).to_pylist()


def with_comm_ids(ops: pa.Table, events: pa.Table) -> pa.Table:
    """`ops` (the server's `ops.arrow`) with the comm of each row, from the slice ranks' `events` (aligned with
    the graph: `comm_id`, `group_name`, `group_seq`, `peer`, `tag`): `schemas.SLICE_REPLAY_OPS`."""
    cols = {n: _strings(events[n]) if n in ("kind", "group_name") else events[n].to_pylist()
            for n in ("rank", "seq", "kind", "group_name", "group_seq", "peer", "tag", "comm_id")}
    collective: dict[tuple[str, int], int] = {}
    channel: dict[tuple, list[tuple[int, int]]] = {}
    for rank, seq, kind, group, gseq, peer, tag, comm in zip(*cols.values()):
        if kind == schemas.KIND_COLLECTIVE:
            collective[(group, gseq)] = comm
        elif kind == schemas.KIND_SEND:
            channel.setdefault((group, rank, peer, tag), []).append((seq, comm))
        elif kind == schemas.KIND_RECV:
            channel.setdefault((group, peer, rank, tag), []).append((seq, comm))
    for msgs in channel.values():
        msgs.sort()
    out = []
    for kind, group, k, src, dst, tag in zip(*(ops[n].to_pylist() for n in ("kind", "group_name", "group_seq", "src",
                                                                             "dst", "tag"))):
        if kind == schemas.KIND_COLLECTIVE:
            out.append(collective.get((group, k), -1))
        else:
            msgs = channel.get((group, src, dst, tag), [])
            out.append(msgs[k][1] if k < len(msgs) else -1)
    table = ops.append_column("comm_id", pa.array(out, pa.int64()))
    return table.select(schemas.SLICE_REPLAY_OPS.names).cast(schemas.SLICE_REPLAY_OPS)


def _member_view(events: pa.Table) -> tuple[dict[int, int], dict[int, int]]:
    """Per comm: the last slice member's issue (t_start_ns) and the first slice member's sight of its completion
    (its wait's end, or the op's t_complete_ns), as `from_slices` reads them."""
    kind = _strings(events["kind"])
    comm, start, end, done = (events[n].to_numpy() for n in ("comm_id", "t_start_ns", "t_end_ns", "t_complete_ns"))
    eid, wait_op = events["event_id"].to_numpy(), events["op_event_id"].to_numpy()
    last: dict[int, int] = {}
    seen: dict[int, int] = {}
    op_comm = {}
    for i, k in enumerate(kind):
        if k in (schemas.KIND_COLLECTIVE, schemas.KIND_SEND, schemas.KIND_RECV) and comm[i] >= 0:
            c = int(comm[i])
            last[c] = max(last.get(c, start[i]), int(start[i]))
            if k != schemas.KIND_SEND:
                op_comm[int(eid[i])] = c
                if done[i] >= 0:
                    seen[c] = min(seen.get(c, int(done[i])), int(done[i]))
    for i, k in enumerate(kind):
        if k == schemas.KIND_WAIT and int(wait_op[i]) in op_comm:
            c = op_comm[int(wait_op[i])]
            seen[c] = min(seen.get(c, int(end[i])), int(end[i]))
    return last, seen


def lateness(ops: pa.Table, events: pa.Table) -> list[dict]:
    """Per (kind, op, virtual members) of the server's ops (`SLICE_REPLAY_OPS`) with a comm the slice ranks
    issued: n; late: how many it issued after the slice's last member, and by how much (ms: median, p95, max,
    and the sum per op); turnaround (its own issue time) and the slice members' measured delay (median ms)."""
    last, seen = _member_view(events)
    groups: dict[tuple, list[tuple[float, float, float]]] = {}
    for kind, op, n, comm, ready, issued in zip(*(ops[c].to_pylist() for c in (
            "kind", "op", "virtual_members", "comm_id", "t_ready_ns", "t_issued_ns"))):
        if comm < 0 or comm not in last or issued < 0:
            continue
        delay = (seen[comm] - last[comm]) / 1e6 if comm in seen else np.nan
        groups.setdefault((kind, op, n), []).append(((issued - last[comm]) / 1e6, (issued - ready) / 1e6, delay))
    rows = []
    for (kind, op, n), vals in sorted(groups.items()):
        a = np.asarray(vals, dtype=np.float64)
        late = np.maximum(a[:, 0], 0)
        rows.append({"kind": kind, "op": op, "virtual_members": n, "n": len(a), "late_n": int((a[:, 0] > 0).sum()),
                     "late_median_ms": float(np.median(late)), "late_p95_ms": float(np.percentile(late, 95)),
                     "late_max_ms": float(late.max()), "late_mean_ms": float(late.mean()),
                     "turnaround_median_ms": float(np.median(a[:, 1])),
                     "delay_median_ms": float(np.nanmedian(a[:, 2])) if np.isfinite(a[:, 2]).any() else None,
                     "delay_mean_ms": float(np.nanmean(a[:, 2])) if np.isfinite(a[:, 2]).any() else None})
    return rows


def describe(rows: list[dict]) -> str:
    """One line per row of `lateness` (what `prism slices run` prints)."""
    out = []
    for r in rows:
        delay = "" if r["delay_median_ms"] is None else \
            f"; slice members' delay median {r['delay_median_ms']:.2f} mean {r['delay_mean_ms']:.2f} ms"
        out.append(f"  {r['kind']} {r['op']} ({r['virtual_members']} virtual): {r['n']} ops, issued after the slice's "
                   f"last member {r['late_n']}, by median {r['late_median_ms']:.2f} p95 {r['late_p95_ms']:.2f} max "
                   f"{r['late_max_ms']:.2f} ms; its turnaround median {r['turnaround_median_ms']:.2f} ms{delay}")
    return "\n".join(out)


def read(path) -> pa.Table | None:
    """A slice's `replay_ops.parquet`, None where the run has none (a slice without virtual peers, an older run)."""
    from pathlib import Path

    from prism import artifacts

    path = Path(path)
    if not path.is_file():
        return None
    return artifacts.read_parquet(path)

