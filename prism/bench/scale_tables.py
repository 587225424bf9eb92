"""The tables of `prism bench capture` (`print_table`: capture per W; `print_tables`: Phase 1 with slices per
stage), also for its saved --json rows: `python -m prism.bench.scale_tables ROWS.json ...` (what the device
script prints last)."""

from __future__ import annotations

import sys
from pathlib import Path


def print_table(rows: list[dict], args) -> None:
    gib, mib = 2 ** 30, 2 ** 20
    print(f"\nprism bench capture: P={args.devices}, {args.steps} steps, tiny MoE model, payloads "
          f"{'off' if args.no_payloads else 'on'}, workload warm-up {'off' if args.no_warmup else 'on'}")
    print(f"{'W':>5} {'layout':<18} {'wall s':>7} {'PSS peak':>9} {'cgroup peak':>12} {'rank MiB med/max':>17} "
          f"{'switches':>9} {'events':>10} {'events/s':>9} {'graph MiB':>9} {'payload MiB':>11} {'payload files':>13}")
    for r in rows:
        if r.get("skipped"):
            print(f"{r['W']:>5} skipped: {r['skipped']}")
            continue
        cg = f"{r['cgroup_peak'] / gib:10.2f}Gi" if r["cgroup_peak"] else f"{'n/a':>12}"
        priv = f"{r['rank_private_mib_median'] or 0:.1f}/{r['rank_private_mib_max'] or 0:.1f}"
        events = f"{r['events']:>10,} {r['events_per_s']:>9,.0f} {r['graph_bytes'] / mib:9.2f}" if "events" in r \
            else f"{'-':>10} {'-':>9} {'-':>9}"
        print(f"{r['W']:>5} {r['layout']:<18} {r['wall_s']:7.1f} {r['pss_peak'] / gib:8.2f}G {cg} {priv:>17} "
              f"{r['switches']:>9,} {events} {r['payload_bytes'] / mib:11.1f} {r['payload_files']:>13,}"
              + (f"  (then {r['failed_stage']} failed)" if r.get("failed_stage") else ""))
    done = [r for r in rows if not r.get("skipped") and r.get("fork_s") is not None]
    if done:
        print("\nwhere a capture's time went: fork s (helpers that forked in parallel) / the coordinator's CPU s "
              "over its wall s / the ranks' CPU s")
        for r in done:
            print(f"{r['W']:>5} fork {r['fork_s']:7.2f} ({r.get('fork_helpers') or 0} helpers)  coordinator "
                  f"{r.get('coordinator_cpu_s') or 0:7.1f} / {r.get('coordinator_wall_s') or 0:7.1f}  ranks "
                  f"{r.get('ranks_cpu_s') or 0:8.1f}" + _phases(r))
    split = [r for r in done if r.get("rank_private_setup_mib_median") is not None]
    if split:
        print("\na rank's private MiB: at its end median/max (the largest's rank); at its first wait (its set-up's) "
              "median/max; its steps' (its end - its first wait) median")
        for r in split:
            steps = r.get("rank_private_steps_mib_median")
            print(f"{r['W']:>5} end {r['rank_private_mib_median']:6.2f}/{r['rank_private_mib_max']:6.2f} (rank "
                  f"{r.get('rank_private_max_rank', '-')})  first wait {r['rank_private_setup_mib_median']:6.2f}/"
                  f"{r['rank_private_setup_mib_max']:6.2f}  steps " + (f"{steps:6.2f}" if steps is not None else "-"))
    staged = [r for r in rows if "plan_s" in r and ("calibrate_s" in r or "bare_calibrate_s" in r) and "events" in r]
    if staged:
        print("\nper stage: wall s / peak memory GiB (capture: tree PSS; others: max RSS) / events/s / artifact MiB")
        print(f"{'W':>5} {'events':>10} {'capture':>28} {'graph':>28} {'plan --representative':>28} "
              f"{'calibrate':>28}")
        for r in staged:
            cells = [(r["wall_s"], r["pss_peak"], r["raw_bytes"] + r["payload_bytes"]),
                     (r["graph_s"], r["graph_rss"], r["graph_bytes"]), (r["plan_s"], r["plan_rss"], r["slices_bytes"]),
                     (r.get("bare_calibrate_s", r.get("calibrate_s")), r.get("bare_calibrate_rss", r.get("calibrate_rss")),
                      r["calibrated_bytes"])]  # the bare graph's calibration (with --slices: before them)
            text = [f"{s:6.1f}/{m / gib:5.2f}/{r['events'] / s:9,.0f}/{b / mib:6.1f}" for s, m, b in cells]
            print(f"{r['W']:>5} {r['events']:>10,} " + " ".join(f"{t:>28}" for t in text))
    emulated = [r for r in rows if "emulate_s" in r or "emulate_error" in r]
    if emulated:
        print("\nemulate, one sandbox rank (default SPEC) on 1 device slot: wall s / tree PSS GiB / start-up s / "
              "communicators / s per iteration (sandbox measured, calibrated) / emulation MiB")
        for r in emulated:
            if "emulate_error" in r:
                print(f"{r['W']:>5} failed: {r['emulate_error']}")
                continue
            it, cal = r["emulate_iteration_s"], r["emulate_calibrated_iteration_s"]
            print(f"{r['W']:>5} sandbox {r['emulate_sandbox']:>5} {r['emulate_s']:7.1f} {r['emulate_pss'] / gib:6.2f} "
                  f"{r['emulate_startup_s'] or 0:6.2f} {r['emulate_communicators'] or 0:>4} "
                  f"{it if it is not None else float('nan'):8.3f} {cal if cal is not None else float('nan'):8.3f} "
                  f"{r['emulation_bytes'] / mib:8.2f}")



STAGES = ("graph", "plan", "slices", "from_slices", "calibrate", "emulate", "summary", "report")


def stage_cells(r: dict) -> list[str]:
    """A row's cells, capture first: 'wall s/peak GiB' for each stage that ran, 'FAILED' for the one that failed,
    '-' for those not run (a failed stage's later ones, or a stage this run leaves out)."""
    gib = 2 ** 30
    failed = r.get("failed_stage", "")
    cells = [f"{r['wall_s']:7.1f}/{r['pss_peak'] / gib:6.2f}"]
    for k in STAGES:
        if k == "slices":
            if "slices_run_s" not in r:
                cells.append("-")
                continue
            done = r.get("slice_runs_done", r.get("slice_runs"))
            cells.append(f"{r['slices_run_s']:6.1f}/{r['slices_run_rss'] / gib:5.2f} ({done}/{r['slice_runs']}, "
                         f"{r['slice_run_max_s']:.1f})")
        elif k == "emulate" and "emulate_s" in r:
            cells.append(f"{r['emulate_s']:7.1f}/{r['emulate_pss'] / gib:6.2f}")
        elif k + "_s" in r:
            cells.append(f"{r[k + '_s']:7.1f}/{r[k + '_rss'] / gib:6.2f}")
        else:
            cells.append("-")
    names = {"graph": "graph", "plan": "plan", "slice run": "slices", "durations from the slices": "from_slices",
             "calibrate": "calibrate", "emulate": "emulate", "summary": "summary", "report": "report"}
    for prefix, k in names.items():
        if failed.startswith(prefix):
            i = 1 + STAGES.index(k)
            cells[i] = "FAILED" if cells[i] == "-" else cells[i] + " FAILED"
            break
    return cells


def print_tables(rows: list[dict]) -> None:
    staged = [r for r in rows if "wall_s" in r and ("plan_s" in r or "failed_stage" in r or "slices_run_s" in r)]
    if not staged:
        return
    print("\nPhase 1 with slices, per stage: wall s / peak memory GiB (capture: tree PSS; emulate: its tree's PSS; "
          "others: max RSS); slices: (ran/measured, slowest s)")
    heads = ["capture", "graph", "plan", "slices", "from_slices", "calibrate", "emulate", "summary", "report"]
    print(f"{'W':>5} {'layout':<18} " + " ".join(f"{h:>24}" for h in heads) + f" {'iteration s (bare)':>22}")
    for r in staged:
        it, bare = r.get("iteration_s"), r.get("bare_iteration_s")
        its = f"{it:.4f} ({bare:.3f})" if it is not None and bare is not None else f"{it}"
        print(f"{r['W']:>5} {r['layout']:<18} " + " ".join(f"{t:>24}" for t in stage_cells(r)) + f" {its:>22}")
        if r.get("failed_stage"):
            print(f"{'':>5} {r['error']}")
    late = [(r["W"], x) for r in staged for x in r.get("replay_ops", []) if x["virtual_members"] > 1]
    if late:
        print("\nthe replay server's ops with > 1 virtual member (slices run, replay_ops.parquet): ops, issued after the "
              "slice's last member (n, max ms), the slice members' measured delay (median / mean ms)")
        for w, x in late:
            print(f"{w:>5} slice {x['slice']:>4} {x['op']:<18} {x['virtual_members']:>4} virtual {x['n']:>5} ops  late "
                  f"{x['late_n']:>3} max {x['late_max_ms']:7.2f}  delay {x['delay_median_ms'] or 0:8.2f} / "
                  f"{x['delay_mean_ms'] or 0:8.2f}")

def _phases(row: dict) -> str:
    """A capture row's phases (meta's capture.phases_s: wall s of set-up until every rank first blocked, of the
    steps until the last exit, ...) and its slots' time held, when the capture recorded them."""
    ph = row.get("phases_s")
    if not ph:
        return ""
    shown = " ".join(f"{k} {v:.1f}" for k, v in ph.items() if v is not None)
    held = f", slots held {row['slot_held_s']:.1f} s" if row.get("slot_held_s") is not None else ""
    setup = f", set-up CPU {row['setup_cpu_s']:.1f} s" if row.get("setup_cpu_s") is not None else ""
    return f"  phases: {shown}{setup}{held}"


def main(argv: list[str] | None = None) -> int:
    """`python -m prism.bench.scale_tables ROWS.json ...`: the per-stage tables of the bench's --json files (what
    the device script prints last; a file a killed run left half-written is named and skipped)."""
    import json

    class Args:
        devices, steps, no_payloads, no_warmup = "see each row", 2, False, False

    for path in map(Path, sys.argv[1:] if argv is None else argv):
        try:
            rows = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"{path}: not read ({exc})")
            continue
        print(f"\n== {path.name}")
        Args.devices = next((r["P"] for r in rows if "P" in r), "?")
        print_table(rows, Args)
        print_tables(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

