"""Where a fidelity-bench config's wall goes: every step the bench runs, timed from outside, and each launch split
into phases by a probe (`scripts/fixed_cost_probe/sitecustomize.py`, on PYTHONPATH of every process the bench starts).

    python scripts/fidelity_fixed_cost.py --world 2 --layout "--dp 2" [--small] [--repeats 2] [--steps 8]
        [--devices P] [--rounds 1] [--variants base,new,template --base DIR] [--work DIR] [--json OUT.json]
    python scripts/fidelity_fixed_cost.py --truth-graphs RUN [--copies 5] [--rounds 3]
    python scripts/fidelity_fixed_cost.py --host-stages F [F ...]
    python scripts/fidelity_fixed_cost.py --world 4 --layout "--tp 2 --dp 2" --truth-ab 20

Each round runs the config once per variant, in turn, each in its own process: `run_config` of the bench (its own
commands, in its order) of the variant's tree: `base`, the tree --base (the code before the cuts, e.g. `git archive
COMMIT | tar -x -C DIR`); `new`, this tree with every zygote a new interpreter (the bench's --new-zygotes); `template`,
this tree as the bench runs it (zygotes forked from a warm template). Prints, as medians over the rounds and as ratios
against the first variant: the config's wall, each kind of step's summed wall, and the phases of each kind of launch
(truth, capture, slice, emulate) and of `prism graph`: the interpreter's start, the launcher, the zygote's import of
torch and its warm-up, the forks, each rank's set-up, program import, init_process_group, new_group, step 0, the
measured steps (1..n-1), the steps' tail, destroy_process_group, the trace's writing, the zygote's and the
launcher's ends. A rank-level phase is the job's: from the last rank to reach its start to the last rank to reach
its end (the job waits for its slowest rank). Then what each run measured (truth iteration times, prediction).
`--truth-graphs RUN`: `prism graph` of --copies copies of one truth run (its raw/), one after the other (as the base
bench built each after its run) against all at once on this process's cores (as the bench builds them now).
`--host-stages F`: from a bench call's saved runs (its artifacts unpacked), where each config's wall went.
`--truth-ab N`: N pairs of the config's truth runs, one from a new zygote and one from the template (ABBA): whether
the template changes what a truth run measures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE_DIR = Path(__file__).resolve().parent / "fixed_cost_probe"

# rank-level phases: (name, start mark, end mark); times are the job's (the last rank's)
RANK_PHASES = [
    ("rank set-up (pin, interception; capture: a slot)", "forked", "program"),
    ("program import, arguments", "program", "init_pg"),
    ("init_process_group (rendezvous)", "init_pg", "init_pg_end"),
    ("new_group (the layout's groups)", "init_pg_end", "groups_end"),
    ("model, optimizer, step 0 (not measured)", "groups_end", "step_end#0"),
    ("steps 1..n-1 (measured)", "step_end#0", "step_end#last"),
    ("after the last step (loss all-reduce)", "step_end#last", "destroy"),
    ("destroy_process_group", "destroy", "destroy_end"),
    ("program's end", "destroy_end", "program_end"),
    ("interception.finish (the trace written)", "finish", "finish_end"),
    ("rank's exit", "finish_end", "rank_end"),
]


def read_marks(log: Path) -> dict[int, dict]:
    """pid -> {"ppid", "marks": name -> [t_ns, ...]}."""
    procs: dict[int, dict] = {}
    if not log.is_file():
        return procs
    for line in log.read_text().splitlines():
        pid, ppid, name, t = line.split()
        p = procs.setdefault(int(pid), {"ppid": int(ppid), "marks": defaultdict(list)})
        p["marks"][name].append(int(t))
    return procs


def rank_points(marks: dict) -> dict[str, int]:
    """A rank's phase boundaries (ns)."""
    pts = {k: v[0] for k, v in marks.items() if v}
    for k in ("program_end", "destroy_end", "init_pg_end", "finish_end"):
        if marks.get(k):
            pts[k] = marks[k][-1]
    if marks.get("new_group_end"):
        pts["groups_end"] = marks["new_group_end"][-1]
    elif "init_pg_end" in pts:
        pts["groups_end"] = pts["init_pg_end"]
    steps = marks.get("step_end", [])
    if steps:
        pts["step_end#0"], pts["step_end#last"] = steps[0], steps[-1]
    return pts


def launch_phases(procs: dict[int, dict], root: int, t_start: int, t_end: int) -> list[tuple[str, float]]:
    """The phases (name, s) of one bench step: its process `root` (started at t_start, returned at t_end), and the
    launches inside it (a zygote: a process that forked ranks running a program; several: each phase their mean)."""
    out = []
    r = procs.get(root)
    if r is None:
        return [("(no probe marks)", (t_end - t_start) / 1e9)]
    site = r["marks"]["site"][0]
    out.append(("interpreter start (the bench step's process)", (site - t_start) / 1e9))
    children = defaultdict(list)
    for pid, p in procs.items():
        children[p["ppid"]].append(pid)
    zygotes = [pid for pid, p in procs.items() if p["marks"].get("fork")
               and any(procs[c]["marks"].get("program") for c in children[pid])]
    if not zygotes:
        out.append(("the step's work (no launch)", (r["marks"]["exit"][-1] - site) / 1e9 if r["marks"].get("exit")
                    else (t_end - site) / 1e9))
        if r["marks"].get("exit"):
            out.append(("interpreter exit", (t_end - r["marks"]["exit"][-1]) / 1e9))
        return out
    zygotes.sort(key=lambda z: _zygote_start(procs[z]["marks"]))
    launcher = procs[zygotes[0]]["ppid"]  # (a zygote forked from the template: the template's child; its launcher
    if launcher not in procs:             # is the step's process or, for emulate, that process's child)
        launcher = next((pid for pid, p in procs.items() if p["ppid"] == root), root)
    lm = procs[launcher]["marks"]
    phases: dict[str, float] = {}  # the mean over the step's launches (slices --all: one a slice)

    def add(name: str, seconds: float) -> None:
        phases[name] = phases.get(name, 0.0) + seconds / len(zygotes)

    before = site
    for z in zygotes:
        zm = procs[z]["marks"]
        ranks = [c for c in children[z] if procs[c]["marks"].get("program")]
        others = [c for c in children[z] if c not in ranks]
        zstart = _zygote_start(zm)
        ztorch = zm["torch"][0] if zm.get("torch") else zstart
        add("until the zygote runs (launcher, its checks; new: the interpreter; slices --all: the slice before's "
            "tables)", (zstart - before) / 1e9)
        add("zygote: import torch (and the interception)", (ztorch - zstart) / 1e9)
        add("zygote: warm-up (lazy imports, a step, gc)", (zm["fork"][0] - ztorch) / 1e9)
        add("zygote: forks", (zm["fork"][-1] - zm["fork"][0]) / 1e9)
        pts = [rank_points(procs[c]["marks"]) for c in ranks]
        last = {k: max(p[k] for p in pts if k in p) for k in set().union(*pts) if all(k in p for p in pts)}
        add("until the last rank runs (fork to child)", (last.get("forked", zm["fork"][-1]) - zm["fork"][-1]) / 1e9)
        for name, a, b in RANK_PHASES:
            if a in last and b in last:
                add(name, (last[b] - last[a]) / 1e9)
        end_ranks = last.get("rank_end")
        ends = [procs[c]["marks"]["exit"][-1] for c in others if procs[c]["marks"].get("exit")]
        if ends and end_ranks:  # slice / emulate: the replay process ends after the ranks
            add("replay process's end after the ranks'", (max(ends) - end_ranks) / 1e9)
        zexit = zm["exit"][-1] if zm.get("exit") else zm["zygote_main_end"][-1] if zm.get("zygote_main_end") else None
        if zexit and end_ranks:
            add("zygote: reap, drain, exit", (zexit - end_ranks) / 1e9)
        before = zexit or end_ranks or before
    out += list(phases.items())
    if len(zygotes) > 1:
        out.append(("(launches in the step: the phases above are their mean)", float(len(zygotes))))
    lexit = lm["exit"][-1] if lm.get("exit") else None
    if lexit:
        out.append(("launcher's end (publish; slice run: its tables)", (lexit - before) / 1e9))
    rexit = r["marks"]["exit"][-1] if r["marks"].get("exit") else lexit
    if root != launcher and rexit and lexit:
        out.append(("the step's end after its launcher", (rexit - lexit) / 1e9))
    if rexit:
        out.append(("interpreter exit", (t_end - rexit) / 1e9))
    return out


def _zygote_start(zm: dict) -> int:
    """A new zygote: its interpreter's start; one forked from the template: its main's."""
    return zm["site"][0] if zm.get("site") else zm["zygote_main"][0]


def kind_of(cmd: list[str]) -> str:
    text = " ".join(cmd)
    for key, kind in (("--mode real", "truth"), ("--mode capture", "capture"), ("prism.slices.run", "slice"),
                      (" emulate ", "emulate"), (" graph ", "graph"), ("prism.slices.plan", "plan"),
                      ("prism.calibrate.from_slices", "from_slices"), ("prism.calibrate ", "calibrate")):
        if key in text + " ":
            return kind
    return "other"


class Recorder:
    """Replaces the bench's `_run` (and `_run_parallel`, where it has one): each step runs with the probe on, timed;
    its marks kept."""

    def __init__(self, fidelity, logs: Path) -> None:
        self.fidelity, self.logs, self.steps, self.n = fidelity, logs, [], 0
        fidelity._run = self
        if hasattr(fidelity, "_run_parallel"):
            original = fidelity._run_parallel

            def parallel(cmds, log, timeout, jobs):
                t0 = time.monotonic_ns()
                try:
                    original(cmds, log, timeout, jobs)
                finally:
                    self.steps.append({"kind": f"{kind_of(cmds[0])} (in parallel)", "cmd": [c[2:] for c in cmds],
                                       "wall_s": (time.monotonic_ns() - t0) / 1e9, "phases": []})

            fidelity._run_parallel = parallel

    def __call__(self, cmd: list[str], log: Path, timeout: float) -> None:
        self.n += 1
        marks = self.logs / f"step{self.n:03d}.marks"
        os.environ["PRISM_COST_PROBE"] = str(marks)
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        t0 = time.monotonic_ns()
        with open(log, "ab") as f:
            f.write(("$ " + " ".join(cmd) + "\n").encode())
            f.flush()
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
            code = proc.wait(timeout=timeout)
        t1 = time.monotonic_ns()
        del os.environ["PRISM_COST_PROBE"]
        phases = launch_phases(read_marks(marks), proc.pid, t0, t1)
        self.steps.append({"kind": kind_of(cmd), "cmd": cmd[2:], "wall_s": (t1 - t0) / 1e9, "phases": phases})
        if code != 0:
            raise self.fidelity.StepError(f"{' '.join(cmd[2:5])} ... exited {code} (log {log})")


def median_phases(steps: list[dict]) -> list[tuple[str, float]]:
    names = list(dict.fromkeys(n for s in steps for n, _ in s["phases"]))
    vals = defaultdict(list)
    for s in steps:
        for n, v in s["phases"]:
            vals[n].append(v)
    return [(n, statistics.median(vals[n])) for n in names]


# base: the bench of the tree --base (the code before the cuts); new: this tree's bench, every zygote a new
# interpreter (its --new-zygotes); template: this tree's bench as it runs (zygotes forked from a warm template)
VARIANTS = ("base", "new", "template")


def child(a) -> int:
    """One run of the config (`run_config` of the variant's tree) in this process; its record to --json."""
    tree = Path(a.tree).resolve()
    sys.path.insert(0, str(tree))
    from prism.bench import fidelity
    from prism.bench.fidelity_table import Config

    assert Path(fidelity.__file__).resolve().is_relative_to(tree), (fidelity.__file__, tree)
    work = Path(a.work)
    cfg = Config("probe", a.world, tuple(a.layout.split()), a.devices or max(a.world // 2, 1))
    rec = Recorder(fidelity, work / "marks")
    rec.logs.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    template = None
    if a.child == "template":
        from prism import settings
        from prism.runtime.launch import launcher, zygote_template

        template = zygote_template.Template.start(dict(launcher.template_environment(), PRISM_COST_PROBE_TEMPLATE="1"))
        os.environ[settings.ZYGOTE_TEMPLATE.name] = template.path
    started = time.perf_counter() - t
    try:
        res = fidelity.run_config(cfg, cfg.devices, a.repeats, 1, a.steps,
                                  fidelity.SMALL_MODEL if a.small else fidelity.MODEL, work / "runs", 600,
                                  not a.no_emulate)
    finally:
        if template is not None:
            template.stop()
    if res.error:
        print(f"{a.child}: {res.error}", file=sys.stderr)
        return 1
    Path(a.json).write_text(json.dumps({
        "variant": a.child, "wall_s": time.perf_counter() - t - started, "template_start_s": started,
        "stage_s": res.stage_s, "truth_ms": res.truth_ms, "pred_ms": res.pred_ms, "steps": rec.steps}))
    return 0


def cells(values: list[float], fmt: str = "{:.2f}") -> str:
    """The values, then each later one's ratio to the first."""
    out = [fmt.format(x) for x in values]
    out += [f"{x / values[0]:.2f}" if values[0] else "-" for x in values[1:]]
    return " | ".join(out)


def report(runs: list[dict], variants: list[str], a, command: str) -> None:
    by = {v: [r for r in runs if r["variant"] == v] for v in variants}
    print(f"# {command}\n# W={a.world} {a.layout}, {a.repeats} truth runs; {a.rounds} round(s), each running "
          f"{', '.join(variants)} in turn; the medians over rounds (ratios: against {variants[0]})\n")
    head = " | ".join(variants) + "".join(f" | {v}/{variants[0]}" for v in variants[1:])
    rule = "|".join(["---"] * (len(variants) * 2))
    print(f"| wall s | {head} |\n|{rule}|")
    print(f"| the config (`run_config`) | {cells([statistics.median(r['wall_s'] for r in by[v]) for v in variants])} |")
    if "template" in variants:
        starts = [statistics.median(r["template_start_s"] for r in by[v]) for v in variants]
        print(f"| the template's start (once a bench, not in the config's) | {cells(starts)} |")
    kinds = list(dict.fromkeys(s["kind"] for r in runs for s in r["steps"]))
    for kind in kinds:
        per, counts = [], []
        for v in variants:
            per.append(statistics.median(sum(s["wall_s"] for s in r["steps"] if s["kind"] == kind) for r in by[v]))
            counts.append(sum(s["kind"] == kind for s in by[v][0]["steps"]))
        n = "/".join(str(c) for c in counts)
        print(f"| {kind} (x{n}, summed) | {cells(per)} |")
    for kind in ("truth", "capture", "slice", "emulate", "graph"):
        steps = {v: [s for r in by[v] for s in r["steps"] if s["kind"] == kind and s["phases"]] for v in variants}
        if not all(steps.values()):
            continue
        print(f"\n{kind}: its phases, s (a launch's: the median over a variant's {kind} steps; a step of several "
              "launches, slices --all, gives their mean; the launcher's own start and end are the step's)\n")
        print(f"| phase | {head} |\n|{rule}|")
        med = {v: dict(median_phases(steps[v])) for v in variants}
        for name in dict.fromkeys(n for v in variants for n in med[v]):
            print(f"| {name} | {cells([med[v].get(name, 0.0) for v in variants], '{:.3f}')} |")
    print("\nwhat the runs measured (ms): each truth run's iteration time; the prediction")
    for r in runs:
        print(f"  {r['variant']}: truth {', '.join(f'{x:.1f}' for x in r['truth_ms'])}; prism "
              f"{', '.join(f'{x:.1f}' for x in r['pred_ms'])}")


def truth_graphs(run: Path, copies: int, rounds: int, work: Path, command: str) -> int:
    """`prism graph` of `copies` copies of one truth run: one after the other (the base bench: each after its run)
    against all at once on this process's cores (`fidelity.build_truth_graphs`), alternated, `rounds` times."""
    sys.path.insert(0, str(ROOT))
    from prism.bench import fidelity

    runs = []
    for i in range(copies):
        runs.append(work / f"truth{i}")
        shutil.rmtree(runs[-1], ignore_errors=True)
        shutil.copytree(run / "raw", runs[-1] / "raw")
    walls, cpus = defaultdict(list), defaultdict(list)
    log = work / "log.txt"
    for i in range(rounds):
        for way in (("one after the other", "all at once") if i % 2 == 0 else ("all at once", "one after the other")):
            for r in runs:
                shutil.rmtree(r / "graph", ignore_errors=True)
            t, used = time.perf_counter(), _children_cpu_s()
            if way == "all at once":
                fidelity._run_parallel([fidelity._prism("graph", "--job", str(r)) for r in runs], log, 600,
                                       jobs=min(len(runs), fidelity.usable_cores()))
            else:
                for r in runs:
                    fidelity._run(fidelity._prism("graph", "--job", str(r)), log, 600)
            walls[way].append(time.perf_counter() - t)
            cpus[way].append((_children_cpu_s() - used) / len(runs))
    seq, par = statistics.median(walls["one after the other"]), statistics.median(walls["all at once"])
    print(f"# {command}\n# {copies} copies of {run}, {fidelity.usable_cores()} cores, {rounds} rounds alternated\n")
    print(f"| prism graph of {copies} truth runs | wall s (median; each round's) | ratio | CPU s a graph (median) |\n"
          "|---|---|---|---|")
    for way, med in (("one after the other", seq), ("all at once", par)):
        print(f"| {way} | {med:.2f} ({', '.join(f'{x:.2f}' for x in walls[way])}) | {med / seq:.2f} | "
              f"{statistics.median(cpus[way]):.2f} |")
    return 0


def _children_cpu_s() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def truth_ab(a, work: Path, command: str) -> int:
    """--truth-ab N: N pairs of truth runs of the config (the bench's own `run_truth`), one from a new zygote and
    one from the template, in ABBA order; each run's iteration time (the bench's), and the pairs' differences."""
    sys.path.insert(0, str(ROOT))
    from prism import settings
    from prism.bench import fidelity
    from prism.bench.fidelity_table import Config
    from prism.runtime.launch import launcher, zygote_template

    cfg = Config("probe", a.world, tuple(a.layout.split()), a.devices or max(a.world // 2, 1))
    args = cfg.args(a.steps, fidelity.SMALL_MODEL if a.small else fidelity.MODEL)
    ms: dict[str, list[float]] = {"new": [], "template": []}
    with zygote_template.Template.start(launcher.template_environment()) as template:
        for i in range(a.truth_ab):
            for way in (("new", "template") if i % 2 == 0 else ("template", "new")):
                out = work / f"{way}{i}"
                shutil.rmtree(out, ignore_errors=True)
                if way == "template":
                    os.environ[settings.ZYGOTE_TEMPLATE.name] = template.path
                try:
                    fidelity.run_truth(cfg, args, out, work / "log.txt", 600)
                finally:
                    os.environ.pop(settings.ZYGOTE_TEMPLATE.name, None)
                zygote = json.loads((out / "raw" / "meta.json").read_text())["zygote"]
                assert zygote == way, (out, zygote)
                ms[way].append(fidelity._median_gap_ms(*fidelity.truth_ends(out)))
                shutil.rmtree(out)
    diff = [t - n for t, n in zip(ms["template"], ms["new"])]
    print(f"# {command}\n# W={a.world} {a.layout}, {a.steps} steps, {a.truth_ab} pairs (ABBA)\n")
    print("| truth runs | n | iteration ms: median | mean | min-max |\n|---|---|---|---|---|")
    for way, xs in ms.items():
        print(f"| {way} zygote | {len(xs)} | {statistics.median(xs):.2f} | {statistics.mean(xs):.2f} | "
              f"{min(xs):.2f}-{max(xs):.2f} |")
    print(f"\npairs, template - new (ms): median {statistics.median(diff):+.2f}, mean {statistics.mean(diff):+.2f}; "
          f"template lower in {sum(d < 0 for d in diff)} of {len(diff)} pairs")
    print("runs (ms), new: " + ", ".join(f"{x:.1f}" for x in ms["new"]))
    print("runs (ms), template: " + ", ".join(f"{x:.1f}" for x in ms["template"]))
    return 0


def host_stages(folders: list[Path], command: str) -> int:
    """Where a config's wall went in a bench call's saved runs (F: its artifacts unpacked, with each stream's
    fidelity.json): the stages (`stage_s`), truth0's launch (meta.json `wall_s`) against its events' span and its
    measured steps, the capture's launch and its zygote's warm-up (`capture.phases_s`, of it the immortalising),
    the emulation's launch."""
    import numpy as np
    import pyarrow.parquet as pq

    print(f"# {command}\n")
    print("| config | W | truth stage s, mean (min-max) | truth0's launch | its events' span | its steps 1..n-1 | "
          "capture stage | capture launch | its zygote's warm-up | of it immortalise | graph+plan | slices | "
          "emulate stage | emulate launch | config (sum of stages) |\n|" + "---|" * 15)
    for folder in folders:
        stages = {r["config"]: r["stage_s"] for f in sorted(folder.glob("*/fidelity.json"))
                  for r in json.loads(f.read_text())}
        for truth0 in sorted(folder.glob("*/*/truth0")):
            name, st = truth0.parent.name, stages[truth0.parent.name]
            meta = json.loads((truth0 / "raw" / "meta.json").read_text())
            ev = pq.read_table(truth0 / "graph" / "events.parquet", columns=["op", "t_start_ns", "t_end_ns",
                                                                             "iteration"])
            op, end, it = (np.array(ev[c].to_pylist()) for c in ("op", "t_end_ns", "iteration"))
            ends = end[op == "iteration_end"]
            its = it[op == "iteration_end"]
            steps = (ends[its == its.max()].max() - ends[its == its.min()].max()) / 1e9
            span = (end.max() - ev["t_start_ns"].to_numpy().min()) / 1e9
            job = truth0.parent / "prism0"
            cap = json.loads((job / "capture" / "raw" / "meta.json").read_text())
            emu = job / "emulation" / "meta.json"
            emu_wall = json.loads(emu.read_text())["wall_s"] if emu.is_file() else float("nan")
            truths = [v for k, v in st.items() if k.startswith("truth") and k[5:].isdigit()]
            print(f"| {name} | {meta['world_size']} | {statistics.mean(truths):.1f} ({min(truths):.1f}-{max(truths):.1f})"
                  f" | {meta['wall_s']:.1f} | {span:.1f} | {steps:.1f} | {st['prism0-capture']:.1f} | "
                  f"{cap['wall_s']:.1f} | {cap['capture']['phases_s']['warm']:.1f} | "
                  f"{cap['capture'].get('immortal', {}).get('seconds', 0):.2f} | {st['prism0-graph+plan']:.1f} | "
                  f"{st['prism0-slices']:.1f} | {st.get('prism0-emulate', float('nan')):.1f} | {emu_wall:.1f} | "
                  f"{sum(st.values()):.0f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int)
    ap.add_argument("--layout", help='the config\'s layout arguments, e.g. "--tp 2 --dp 2"')
    ap.add_argument("--devices", type=int, help="P (default W/2)")
    ap.add_argument("--small", action="store_true", help="the bench's SMALL_MODEL (default: its MODEL)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1, help="rounds; each runs every variant once, in turn")
    ap.add_argument("--variants", default="new,template", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--base", type=Path, help="variant base: a source tree of the code before (e.g. git archive "
                                              "COMMIT | tar -x -C DIR)")
    ap.add_argument("--no-emulate", action="store_true")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--json", type=Path, help="write every run's steps and phases here")
    ap.add_argument("--truth-graphs", type=Path, metavar="RUN",
                    help="instead: time `prism graph` of --copies copies of the truth run RUN (its raw/), one after "
                         "the other against all at once")
    ap.add_argument("--copies", type=int, default=5)
    ap.add_argument("--truth-ab", type=int, metavar="N",
                    help="instead: N pairs of truth runs of the config, a new zygote's and the template's, ABBA: "
                         "their iteration times")
    ap.add_argument("--host-stages", type=Path, nargs="+", metavar="F",
                    help="instead: where each config's wall went in a bench call's saved runs (F: its artifacts "
                         "unpacked, beside each stream's fidelity.json)")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child(a)
    command = " ".join(["python", "scripts/fidelity_fixed_cost.py", *(argv or sys.argv[1:])])
    if a.host_stages:
        return host_stages(a.host_stages, command)
    if a.truth_graphs:
        work = a.work or Path(tempfile.mkdtemp(prefix="prism-truth-graphs-"))
        return truth_graphs(a.truth_graphs, a.copies, a.rounds, work, command)
    if a.world is None or a.layout is None:
        ap.error("--world and --layout are needed (or --truth-graphs RUN, --host-stages F)")
    if a.truth_ab:
        work = a.work or Path(tempfile.mkdtemp(prefix="prism-truth-ab-"))
        work.mkdir(parents=True, exist_ok=True)
        return truth_ab(a, work, command)
    variants = a.variants.split(",")
    if "base" in variants and a.base is None:
        ap.error("variant base needs --base DIR")
    work = a.work or Path(tempfile.mkdtemp(prefix="prism-fixed-cost-"))
    runs = []
    for i in range(a.rounds):
        for v in variants:
            tree = a.base if v == "base" else ROOT
            out = work / f"round{i}-{v}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            cmd = [sys.executable, __file__, "--child", v, "--tree", str(tree), "--work", str(out), "--json",
                   str(out / "run.json"), "--world", str(a.world), "--layout", a.layout, "--repeats", str(a.repeats),
                   "--steps", str(a.steps)] + (["--devices", str(a.devices)] if a.devices else []) + \
                  (["--small"] if a.small else []) + (["--no-emulate"] if a.no_emulate else [])
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(tree).resolve()), str(PROBE_DIR)]))
            done = subprocess.run(cmd, env=env, cwd=tree)
            if done.returncode != 0:
                return done.returncode
            runs.append(json.loads((out / "run.json").read_text()))
            print(f"[round {i} {v}: {runs[-1]['wall_s']:.1f} s]", file=sys.stderr, flush=True)
    report(runs, variants, a, command)
    if a.json:
        a.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
