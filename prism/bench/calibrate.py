"""`prism bench calibrate`: the global-clock sweep on synthetic training graphs of W ranks x ~2000 events.

Per size (default W in {16, 1024, 8192}: 32 K, 2 M and 16 M events; `--sizes` to choose), prints:

- discover: the first numba sweep from the graph's arrays (as read from the artifacts): checks, codes,
  bundles, the worklist sweep, the schedule's layout and the timeline (median of a few runs);
- (no bundles): the replay kernel on a schedule discovered rank by rank, without lockstep bundles;
- replay kernel: a repeated sweep with the durations and transfers already laid out in schedule order
  (`Schedule.replay_scheduled`, output buffer reused; median of `--repeats`), the number the target is
  about; replay e2e: the same from event-ordered durations to the event-ordered timeline (layout in,
  kernel, layout out, comm times);
- the plain-Python reference and a networkx longest path (an event-end node per event, a node per comm),
  on the sizes where the previous size's rate predicts they finish within `--budget` seconds (with a
  factor 2 margin: both slow down more than linearly as they grow);
- memory per event: what the graph holds (structure, labels, durations, transfers) and what the sweep
  adds (the schedule with its replay buffers, one timeline), in bytes per event; the process's peak RSS.

Every run is checked: replay == discover, reference == discover, networkx makespan == max end.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import resource
import statistics
import sys
import time

import numpy as np

from prism.calibrate import reference
from prism.calibrate.arrays import SweepGraph
from prism.calibrate.sweep import Schedule, Timeline, discover
from prism.calibrate.synthetic import Synthetic, layout_for, training_graph


def _timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times), result


def _networkx_makespan(syn: Synthetic) -> int:
    """The job's makespan as a longest path: a node per event end, a node per comm (its last issue).

    A recv's issue does not feed its comm node: its wait starts after it anyway (see `arrays`).
    """
    import networkx as nx

    g: SweepGraph = syn.graph
    d, x = syn.durations.tolist(), syn.transfer.tolist()
    kind, comm, wait_op = g.kind.tolist(), g.comm.tolist(), g.wait_op.tolist()
    ptr = g.rank_ptr.tolist()
    G = nx.DiGraph()
    for r in range(g.n_ranks):
        prev = "start"
        for e in range(ptr[r], ptr[r + 1]):
            G.add_edge(prev, e, weight=d[e])
            k = kind[e]
            if k in (1, 2):  # a collective member or a send: its issue start is the previous end
                G.add_edge(prev, ("c", comm[e]), weight=0)
            elif k == 4 and kind[wait_op[e]] != 2:  # a wait on a collective or a recv: its own time after
                c = comm[wait_op[e]]  # the completion (`clock_rule.wait_ends`)
                G.add_edge(("c", c), e, weight=x[c] + d[e])
            prev = e
    return int(nx.dag_longest_path_length(G, weight="weight"))


def _bytes(*arrays: np.ndarray) -> int:
    return sum(a.nbytes for a in arrays if a is not None)


def run_size(w: int, repeats: int, budget: float, rates: dict[str, float]) -> dict:
    began = time.perf_counter()
    syn = training_graph(layout_for(w), seed=w, labels=True)
    gen_s = time.perf_counter() - began
    g, n = syn.graph, syn.graph.n_events
    row: dict = {"ranks": w, "events": n, "gen_s": gen_s}

    disc_s, (sched, timeline) = _timed(lambda: discover(g, syn.durations, syn.transfer), 3 if n < 4e6 else 2)
    sched: Schedule
    row["discover"] = n / disc_s
    row["bundles"] = sched.n_bundles
    row["segments"] = len(sched.seg_bundle)

    dur_s = sched.to_schedule(syn.durations)
    xfer_s = sched.transfer_to_schedule(syn.transfer)
    end_s = np.zeros(n, dtype=np.int64)
    kernel_s, _ = _timed(lambda: sched.replay_scheduled(dur_s, xfer_s, out=end_s), repeats)
    assert np.array_equal(sched.from_schedule(end_s), timeline.end_ns), "replay differs from discover"
    row["replay"] = n / kernel_s
    row["replay_flat"] = _flat_replay(syn, timeline, repeats)
    gc.collect()  # the unbundled schedule's buffers, before the next measurement

    again = Timeline.empty(n, g.n_comms)
    sched.replay(syn.durations, syn.transfer, out=again)  # first touch of the scratch buffers
    e2e_s, _ = _timed(lambda: sched.replay(syn.durations, syn.transfer, out=again), max(3, repeats // 2))
    for name in ("start_ns", "end_ns", "comm_start_ns", "comm_end_ns"):
        assert np.array_equal(getattr(again, name), getattr(timeline, name)), f"replay {name} differs"
    row["replay_e2e"] = n / e2e_s

    graph_bytes = _bytes(g.rank_ptr, g.kind, g.comm, g.wait_op, g.comm_p2p, g.op_code, g.group_code,
                         syn.durations, syn.transfer)
    row["graph_bytes"] = graph_bytes / n
    row["sweep_bytes"] = (sched.nbytes + _bytes(timeline.start_ns, timeline.end_ns, timeline.comm_start_ns,
                                                timeline.comm_end_ns)) / n

    def same(r) -> bool:
        return np.array_equal(r.end_ns, timeline.end_ns) and np.array_equal(r.comm_end_ns, timeline.comm_end_ns)

    for name, fn, check in (
        ("reference", lambda: reference.sweep(g, syn.durations, syn.transfer), same),
        ("networkx", lambda: _networkx_makespan(syn), lambda r: r == int(timeline.end_ns.max())),
    ):
        if name == "networkx" and importlib.util.find_spec("networkx") is None:
            row[name] = "n/a (not installed)"
            continue
        # both slow down faster than linearly as they grow (Python objects, GC): predict with a margin
        if name in rates and 2 * n / rates[name] > budget:
            row[name] = f"skipped (>{n / rates[name]:.0f} s)"
            continue
        seconds, result = _timed(fn, 1)
        assert check(result), f"{name} disagrees with the numba sweep"
        rates[name] = n / seconds
        row[name] = n / seconds
        del result
        gc.collect()
    return row


def _flat_replay(syn: Synthetic, timeline: Timeline, repeats: int) -> float:
    """The replay kernel's rate on a schedule without bundles (one rank per lane group): what lockstep buys."""
    n = syn.graph.n_events
    flat, _ = discover(syn.graph, syn.durations, syn.transfer, bundle=False)
    flat_dur, flat_xfer = flat.to_schedule(syn.durations), flat.transfer_to_schedule(syn.transfer)
    flat_end = np.zeros(n, dtype=np.int64)
    flat_s, _ = _timed(lambda: flat.replay_scheduled(flat_dur, flat_xfer, out=flat_end), repeats)
    assert np.array_equal(flat.from_schedule(flat_end), timeline.end_ns), "unbundled replay differs"
    return n / flat_s


def _rate(value) -> str:
    if isinstance(value, str):
        return value
    return f"{value / 1e6:,.1f} M/s" if value >= 1e6 else f"{value / 1e3:,.0f} K/s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prism bench calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,1024,8192",
                        help="comma-separated rank counts (powers of two), ~2000 events per rank")
    parser.add_argument("--repeats", type=int, default=7, help="replay kernel runs per size (median)")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds the reference / networkx may take at a size (predicted from the last)")
    args = parser.parse_args(argv)
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
        for w in sizes:
            layout_for(w)
    except ValueError as exc:
        print(f"prism bench calibrate: --sizes: {exc}", file=sys.stderr)
        return 2
    # compile (or load the cached kernels) once, outside the timings
    warm = training_graph(layout_for(2), seed=0)
    discover(warm.graph, warm.durations, warm.transfer)[0].replay(warm.durations, warm.transfer)

    rates: dict[str, float] = {}
    rows = []
    for w in sizes:
        rows.append(run_size(w, args.repeats, args.budget, rates))
        gc.collect()  # the size's graph, schedule and timelines, before the next size
        r = rows[-1]
        print(f"  W={w}: {r['events']:,} events, {r['bundles']} bundles, {r['segments']:,} segments "
              f"(generated in {r['gen_s']:.1f} s)", file=sys.stderr, flush=True)
    sys.stderr.flush()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("\nprism bench calibrate: synthetic training graphs (TP/PP/DP/EP, 1F1B, async DP buckets, "
          "EP all-to-all), one core")
    print(f"{'ranks':>6} {'events':>11} {'discover':>10} {'replay kernel':>14} {'(no bundles)':>13} "
          f"{'replay e2e':>11} {'reference (py)':>18} {'networkx':>18} {'B/ev graph':>11} {'B/ev sweep':>11}")
    for r in rows:
        print(f"{r['ranks']:>6} {r['events']:>11,} {_rate(r['discover']):>10} {_rate(r['replay']):>14} "
              f"{_rate(r['replay_flat']):>13} {_rate(r['replay_e2e']):>11} {_rate(r['reference']):>18} "
              f"{_rate(r['networkx']):>18} {r['graph_bytes']:>11.1f} {r['sweep_bytes']:>11.1f}")
    print(f"Rates: events/s, medians. replay kernel: inputs in schedule order, output buffer reused; replay e2e: "
          "event-ordered durations in, event-ordered timeline out, buffers reused.\nB/event graph: structure, "
          f"labels, durations, transfers; sweep: schedule, its scratch buffers, one timeline. "
          f"Peak RSS {peak:.2f} GiB.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
