"""The async all-reduce burst of a saved bench config: every truth run against the slice runs, and the replay
server's part of it (issue 24, suspect (b); docs/fidelity.md "Session 12").

    python scripts/fidelity_burst.py CONFIG_DIR [CONFIG_DIR ...] [--pass slices|slices_timed]
    python scripts/fidelity_burst.py --table CONFIG_DIR [CONFIG_DIR ...]   # the late issues, both passes

Per truth run (truth0, truth1, ...: `graph/` only): its iteration time, compute CPU and wall per rank-iteration,
and the burst drain of the slices' first ranks (`fidelity_terms.burst_drain_ms`). Per slice run of the pass: the
drain, and over the async collectives of iterations >= 1 that the server played (`replay_ops.parquet`): how many
it issued after the slice's last member (`t_issue_ns` > that member's issue) and by how much, how many it was not
ready for by then (`t_ready_ns`: payloads loaded, an in-flight slot free), and the ring's time once every member
had issued (the first slice member's sight of completion - the later of the last slice issue and the server's last
issue call's return), beside truth0's same comms (first sight of completion - last of the 8 issues). Analysis only.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prism import artifacts  # noqa: E402
from prism import job as job_files  # noqa: E402
from prism.bench import fidelity_terms as ft  # noqa: E402
from prism.calibrate.arrays import K_COLLECTIVE, K_COMPUTE, K_WAIT  # noqa: E402
from prism.iterations import iteration_times  # noqa: E402
from prism.slices import replay_ops  # noqa: E402


def _q(a) -> str:
    a = np.asarray(a, dtype=np.float64)
    return "-" if not len(a) else f"{np.median(a):.2f}/{np.percentile(a, 95):.2f}"


def _async(config_dir: Path, job) -> np.ndarray:
    ev = artifacts.read_parquet(job_files.graph_file(config_dir), columns=["rank", "seq", "is_async"])
    order = np.lexsort((ev["seq"].to_numpy(), ev["rank"].to_numpy()))
    return ev["is_async"].to_numpy(zero_copy_only=False)[order]


def truth_lines(config_dir: Path, ranks: list[int]) -> list[str]:
    from prism.calibrate.stage import load_graph

    out = []
    for t in sorted(p for p in config_dir.glob("truth*") if (p / "graph").is_dir()):
        job = load_graph(t)
        c, g = job.columns, job.graph
        sel = (g.kind == K_COMPUTE) & (job.iteration >= 1)
        n = len(np.unique(job.rank[sel])) * len(np.unique(job.iteration[sel]))
        cpu = c["device_ns"][sel].sum() / 1e6 / n
        wall = (c["t_end_ns"] - c["t_start_ns"])[sel].sum() / 1e6 / n
        med = iteration_times(np.asarray(job.iteration), c["t_end_ns"]).median_ms
        is_async = _async(t, job)
        drain = " ".join(f"rank {r} {ft.burst_drain_ms(job, is_async, c, r):.2f}" for r in ranks)
        out.append(f"  {t.name}: iteration {med:.1f} ms; compute CPU {cpu:.1f} wall {wall:.1f} ms per rank-iteration "
                   f"(wall/CPU {wall / cpu:.3f}); burst drain ms per op: {drain}")
    return out


def slice_runs(config_dir: Path, pass_dir: str) -> list[dict]:
    """Per slice run of the pass: the server's late issues and the ring (the module doc), as numbers. The async
    ops are truth0's (its graph), or without a truth run the capture's (`prism0/graph`: the same comm ids), then
    with no truth ring."""
    from prism.calibrate.stage import load_graph

    ref = config_dir / "truth0"
    if not job_files.graph_file(ref).is_file():
        ref = config_dir / "prism0"
    truth = load_graph(ref)
    g, c = truth.graph, truth.columns
    is_async = _async(ref, truth)
    seen_t = np.full(len(g.kind), -1, dtype=np.int64)
    w = np.flatnonzero((g.kind == K_WAIT) & (g.wait_op >= 0))
    seen_t[g.wait_op[w]] = c["t_end_ns"][w]
    ops = np.flatnonzero((g.kind == K_COLLECTIVE) & is_async & (truth.iteration >= 1))
    iteration_of = {int(cm): int(it) for cm, it in zip(g.comm[ops], np.asarray(truth.iteration)[ops])}
    truth_ring = {}
    for comm in np.unique(g.comm[ops]) if ref.name == "truth0" else ():
        m = ops[g.comm[ops] == comm]
        done = seen_t[m][seen_t[m] >= 0]
        if len(done):
            truth_ring[int(comm)] = (done.min() - c["t_start_ns"][m].max()) / 1e6
    out = []
    for folder in sorted((config_dir / "prism0" / pass_dir).glob("slice=*")):
        ops_t = replay_ops.read(folder / "replay_ops.parquet")
        ev = artifacts.read_parquet(folder / "events.parquet")
        if ops_t is None:
            continue
        last, seen = replay_ops._member_view(ev)
        comms = set(int(x) for x in g.comm[ops])  # graph comm ids: the slice events carry the same ones
        late, unready, ring, tring = [], 0, [], []
        burst: dict[tuple, list] = {}  # (group, iteration) -> its async ops' group_seq, for the late ones' places
        late_at: list[tuple] = []
        for comm, group, gseq, ready, issue, issued in zip(*(ops_t[n].to_pylist() for n in (
                "comm_id", "group_name", "group_seq", "t_ready_ns", "t_issue_ns", "t_issued_ns"))):
            if comm not in comms or comm not in last or issue < 0:
                continue
            burst.setdefault((group, iteration_of[comm]), []).append(gseq)
            late.append((issue - last[comm]) / 1e6)
            if late[-1] > 0:
                late_at.append((group, iteration_of[comm], gseq))
            unready += ready > last[comm]
            if comm in seen:
                ring.append((seen[comm] - max(last[comm], issued)) / 1e6)
                if comm in truth_ring:
                    tring.append(truth_ring[comm])
        late = np.asarray(late)
        places = Counter((grp, sorted(burst[grp, it]).index(q) + 1) for grp, it, q in late_at)
        most = {grp: max(len(v) for (h, _), v in burst.items() if h == grp) for grp, _ in places}
        out.append({"run": f"{pass_dir}/{folder.name}", "ops": len(late), "late": int((late > 0).sum()),
                    "late_ms": late[late > 0], "unready": int(unready), "ring": ring, "truth_ring": tring,
                    "places": "; ".join(f"group {grp} (of {most[grp]}): " + ", ".join(
                        f"#{k} x{n}" for (h, k), n in sorted(places.items()) if h == grp) for grp in sorted(most))})
    return out


def slice_lines(config_dir: Path, pass_dir: str) -> list[str]:
    return [f"  {r['run']}: {r['ops']} async ops of iterations >= 1; server issued after the slice's last member "
            f"{r['late']} (by median/p95 {_q(r['late_ms'])} ms), not ready by then {r['unready']}; ring once all "
            f"issued, median/p95 ms: slice {_q(r['ring'])}, truth0 {_q(r['truth_ring'])}"
            for r in slice_runs(config_dir, pass_dir)]


TABLE_HEAD = ["| config dir | slice run | async ops (iterations >= 1) | issued after the slice's last member | of those, "
              "not ready by then | by, median/p95 ms | ring once all had issued, median/p95 ms: slice | truth0, "
              "same comms | the late ones' places: #k of the group's async ops an iteration x count |",
              "|---|---|---|---|---|---|---|---|---|"]


def table_rows(config_dir: Path, pass_dirs: list[str]) -> list[str]:
    """The docs/fidelity.md table's rows: one per slice run of each pass that the config has."""
    name = f"{config_dir.parent.name}/{config_dir.name}"
    return [f"| {name} | {r['run']} | {r['ops']} | {r['late']} | {r['unready']} | {_q(r['late_ms'])} | "
            f"{_q(r['ring'])} | {_q(r['truth_ring'])} | {r['places'] or '-'} |"
            for d in pass_dirs if (config_dir / "prism0" / d).is_dir() for r in slice_runs(config_dir, d)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dirs", type=Path, nargs="+", metavar="CONFIG_DIR")
    p.add_argument("--pass", dest="pass_dir", default=job_files.TIMED_SLICES, choices=("slices", "slices_timed"))
    p.add_argument("--table", action="store_true",
                   help="only the server's late issues, as one markdown table over both passes (docs/fidelity.md)")
    a = p.parse_args(argv)
    missing = [str(d) for d in a.dirs if not (d / "prism0" / "slices" / "plan.parquet").is_file()]
    if missing:
        print(f"fidelity_burst: not a saved bench config (no prism0/slices/plan.parquet): {', '.join(missing)}; "
              "give the config folders of an unpacked artifacts tarball, e.g. /tmp/fid/a/dp8-var", file=sys.stderr)
        return 2
    if a.table:
        print("\n".join(TABLE_HEAD + [row for d in a.dirs for row in table_rows(d, [job_files.SLICES,
                                                                                  job_files.TIMED_SLICES])]))
        return 0
    for d in a.dirs:
        plan = artifacts.read_parquet(d / "prism0" / "slices" / "plan.parquet").to_pylist()
        print(d)
        ranks = sorted({min(r["rank"] for r in plan if r["slice"] == k) for k in {r["slice"] for r in plan}})
        print("\n".join(truth_lines(d, ranks) + slice_lines(d, a.pass_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
