"""A small job folder written by hand (graph tables, calibrated timeline, baseline, emulation) for the
report and export tests: 2 ranks, 3 iterations of compute -> all_reduce -> wait -> iteration_end, plus a
send/recv pair per iteration from rank 0 to rank 1; rank 1 computes longer, so rank 0 waits on it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from prism import schemas
from prism.artifacts import write_outputs, write_parquet
from prism.calibrate.stage import calibrate

ITERATIONS = 3
COMPUTE_NS = (1_000_000, 3_000_000)  # rank 0, rank 1


def _events() -> tuple[list[dict], list[dict]]:
    rows: list[dict] = []
    comms: dict[int, dict] = {}
    base = {f.name: (-1 if pa.types.is_integer(f.type) else None) for f in schemas.EVENTS}
    base.update(is_async=True, stream=0, bytes=0, tag=0, microbatch=-1, group_name=None, dtype=None, shape=None)
    for rank in (0, 1):
        t = 0
        seq = 0
        for it in range(ITERATIONS):
            c_ar, c_p2p = 2 * it, 2 * it + 1

            def add(kind, op, dur, comm=-1, op_event=-1, group=None, nbytes=0, mem=-1):
                nonlocal t, seq
                eid = rank * 1000 + seq
                rows.append({**base, "event_id": eid, "rank": rank, "seq": seq, "kind": kind, "op": op,
                             "group_name": group, "iteration": it, "t_start_ns": t, "t_end_ns": t + dur,
                             "cpu_ns": dur, "device_ns": dur, "t_complete_ns": t + dur, "comm_id": comm,
                             "op_event_id": op_event, "bytes": nbytes, "mem_peak_bytes": mem,
                             "mem_bytes": mem, "group_seq": it if group else -1})
                if comm >= 0:
                    comms.setdefault(comm, {"members": [], "event_ids": []})
                    comms[comm]["members"].append(rank)
                    comms[comm]["event_ids"].append(eid)
                t += dur
                seq += 1
                return eid

            add("compute", "compute", COMPUTE_NS[rank], mem=(rank + 1) * 2**20)
            op = add("collective", "all_reduce", 10_000, comm=c_ar, group="0", nbytes=4096)
            add("wait", "wait", 5_000, op_event=op)
            if rank == 0:
                op = add("send", "send", 2_000, comm=c_p2p, nbytes=1024)
            else:
                op = add("recv", "recv", 2_000, comm=c_p2p, nbytes=1024)
            add("wait", "wait", 1_000, op_event=op)
            add("marker", "iteration_end", 0)
    comm_rows = []
    for cid, c in sorted(comms.items()):
        p2p = cid % 2 == 1
        comm_rows.append({"comm_id": cid, "kind": "p2p" if p2p else "collective",
                          "op": "send_recv" if p2p else "all_reduce", "group_name": None if p2p else "0",
                          "group_seq": -1 if p2p else cid // 2, "src": 0 if p2p else -1, "dst": 1 if p2p else -1,
                          "tag": 0, "n_members": 2, "bytes": 4096, "members": c["members"],
                          "event_ids": c["event_ids"], "iteration": cid // 2, "t_first_start_ns": 0,
                          "t_last_start_ns": 0, "t_last_end_ns": 0})
    return rows, comm_rows


RUN_ID = "report-test-run"


def _write_graph(folder: Path, rows: list[dict], comm_rows: list[dict], scale: float = 1.0,
                 run_id: str = RUN_ID) -> None:
    scaled = [{**r, **{k: int(r[k] * scale) for k in ("t_start_ns", "t_end_ns", "t_complete_ns")}} for r in rows]
    write_parquet(pa.Table.from_pylist(scaled), folder / "events.parquet", schemas.EVENTS, run_id=run_id)
    write_parquet(pa.Table.from_pylist(comm_rows), folder / "comms.parquet", schemas.COMMS, run_id=run_id)
    write_parquet(pa.Table.from_pylist([{"group_name": "0", "group_desc": "dp", "size": 2, "members": [0, 1],
                                         "ring": [0, 1], "backend": "gloo"}]), folder / "groups.parquet", schemas.GROUPS,
                  run_id=run_id)
    write_parquet(pa.Table.from_pylist([{"rank": r, "node": "n0", "tp": -1, "pp": -1, "dp": r, "ep": -1,
                                         "n_events": len(rows) // 2, "iterations": ITERATIONS,
                                         "iteration_rule": "outermost optimizer step",
                                         "microbatch_rule": "forward of a module with trainable parameters"}
                                        for r in (0, 1)]),
                  folder / "ranks.parquet", schemas.RANKS, run_id=run_id)


def make_job(job: Path, baseline: bool = True, emulation: bool = False) -> Path:
    rows, comm_rows = _events()
    _write_graph(job / "graph", rows, comm_rows)
    tables, _, _ = calibrate(job)
    write_outputs(job / "calibrated", tables, run_id=RUN_ID)
    if baseline:  # the real run: 10 % slower than the graph's times
        _write_graph(job / "baseline" / "graph", rows, comm_rows, scale=1.1, run_id="report-test-baseline")
    if emulation:  # rank 1 ran in the sandbox (measured 5 % slower), rank 0 was replayed
        ev = tables["timeline"].to_pylist()
        graph = {r["event_id"]: r for r in rows}
        out = []
        for e in ev:
            g = graph[e["event_id"]]
            s = 1.05 if g["rank"] == 1 else 1.0
            out.append({**{k: g[k] for k in ("event_id", "rank", "seq", "kind", "op", "group_name", "iteration",
                                            "comm_id", "op_event_id", "bytes", "stream", "mem_peak_bytes")},
                        "start_ns": int(e["start_ns"] * s), "end_ns": int(e["end_ns"] * s),
                        "source": "sandbox" if g["rank"] == 1 else "replay"})
        (job / "emulation").mkdir(parents=True)
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(out).replace_schema_metadata({b"prism.run_id": RUN_ID.encode()}),
                       job / "emulation" / "events.parquet")
        # iterations: the job under the sandbox computed as calibrated, rank 1's measured ones 5 % later
        its = tables["iterations"].to_pylist()
        rows_it = [{**r, "source": "computed"} for r in its]
        rows_it += [{**r, **{k: int(r[k] * 1.05) for k in ("start_ns", "end_ns")}, "source": "sandbox"}
                    for r in its if r["rank"] == 1]
        for r in rows_it:
            r["duration_ns"] = r["end_ns"] - r["start_ns"]
        write_parquet(pa.Table.from_pylist(rows_it), job / "emulation" / "iterations.parquet",
                      schemas.EMULATION_ITERATIONS, run_id=RUN_ID)
        write_parquet(hand_made_delays(), job / "emulation" / "delays.parquet", schemas.EMULATION_DELAYS,
                      run_id=RUN_ID)
    return job


def hand_made_delays() -> pa.Table:
    """The emulation's own delays of the sandbox's real exchanges: per iteration its all_reduce 0.25 ms and its
    message 1 ms late (iteration 0: 2 ms each) against the model."""
    import numpy as np

    from prism.emulate import delays

    late = {"op": np.asarray(["all_reduce", "send/recv"] * ITERATIONS, dtype=object),
            "iteration": np.repeat(np.arange(ITERATIONS), 2),
            "late_ns": np.asarray([2_000_000, 2_000_000] + [250_000, 1_000_000] * (ITERATIONS - 1)),
            "vs_calibrated_ns": np.full(2 * ITERATIONS, 3_000_000.0)}
    return delays.delays_table(late, list(range(ITERATIONS)))


def make_wide_job(job: Path, world: int = 1024, stages: int = 4, iterations: int = 3) -> Path:
    """A job of `world` ranks in `stages` pipeline stages, written by hand and calibrated from its own durations:
    per iteration every rank computes (longer in later stages, and a little by rank), all-reduces over its stage
    (one collective per stage), waits for it, and ends the iteration. For the report at W=1024 and beyond."""
    per_stage = world // stages
    base = {f.name: (-1 if pa.types.is_integer(f.type) else None) for f in schemas.EVENTS}
    base.update(is_async=True, stream=0, bytes=0, tag=0, microbatch=-1, dtype=None, shape=None)
    rows, comms = [], {}
    for rank in range(world):
        stage = rank // per_stage
        t = seq = 0
        for it in range(iterations):
            cid = it * stages + stage
            for kind, op, dur in (("compute", "compute", 1_000_000 * (1 + stage) + 997 * (rank % 7)),
                                  ("collective", "all_reduce", 20_000), ("wait", "wait", 5_000),
                                  ("marker", "iteration_end", 0)):
                eid = rank * 100 + seq
                coll = kind == "collective"
                rows.append({**base, "event_id": eid, "rank": rank, "seq": seq, "kind": kind, "op": op,
                             "group_name": f"s{stage}" if coll else None, "iteration": it, "t_start_ns": t,
                             "t_end_ns": t + dur, "cpu_ns": dur, "device_ns": dur, "t_complete_ns": t + dur,
                             "comm_id": cid if coll else -1, "op_event_id": eid - 1 if kind == "wait" else -1,
                             "bytes": 4096 if coll else 0, "mem_peak_bytes": (64 + stage) * 2**20,
                             "mem_bytes": 64 * 2**20, "group_seq": it if coll else -1})
                if coll:
                    comms.setdefault(cid, {"members": [], "event_ids": []})
                    comms[cid]["members"].append(rank)
                    comms[cid]["event_ids"].append(eid)
                t += dur
                seq += 1
    comm_rows = [{"comm_id": cid, "kind": "collective", "op": "all_reduce", "group_name": f"s{cid % stages}",
                  "group_seq": cid // stages, "src": -1, "dst": -1, "tag": 0, "n_members": len(c["members"]),
                  "bytes": 4096, "members": c["members"], "event_ids": c["event_ids"], "iteration": cid // stages,
                  "t_first_start_ns": 0, "t_last_start_ns": 0, "t_last_end_ns": 0} for cid, c in sorted(comms.items())]
    folder = job / "graph"
    write_parquet(pa.Table.from_pylist(rows), folder / "events.parquet", schemas.EVENTS, run_id=RUN_ID)
    write_parquet(pa.Table.from_pylist(comm_rows), folder / "comms.parquet", schemas.COMMS, run_id=RUN_ID)
    members = [list(range(s * per_stage, (s + 1) * per_stage)) for s in range(stages)]
    write_parquet(pa.Table.from_pylist([{"group_name": f"s{s}", "group_desc": "dp", "size": per_stage, "members": m,
                                         "ring": m, "backend": "gloo"} for s, m in enumerate(members)]),
                  folder / "groups.parquet", schemas.GROUPS, run_id=RUN_ID)
    write_parquet(pa.Table.from_pylist([{"rank": r, "node": "n0", "tp": -1, "pp": r // per_stage, "dp": r % per_stage,
                                         "ep": -1, "n_events": 4 * iterations, "iterations": iterations,
                                         "iteration_rule": "outermost optimizer step",
                                         "microbatch_rule": "forward of a module with trainable parameters"}
                                        for r in range(world)]), folder / "ranks.parquet", schemas.RANKS, run_id=RUN_ID)
    tables, _, _ = calibrate(job)
    write_outputs(job / "calibrated", tables, run_id=RUN_ID)
    return job
