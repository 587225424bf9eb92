"""The emulated sandbox's own delay per op kind (issue 24 item 3), from `prism bench fidelity` job folders.

For each config folder (CONFIG/prism0/emulation/meta.json) prints, per op kind of the sandbox's real exchanges, how
late each completed against the model (`vs_model`: the last live virtual arrival + the calibrated transfer; the
emulation's own delay) and against the calibrated timeline (`vs_calibrated`: what the sandbox's own speed also
moves), as `prism/runtime/replay/clock.py` (`TimedReplay.exchange_delays`) records them, and the sandbox's
iteration time against its own prediction from the bench's fidelity.json next to the config folders.

For send/recv, `vs_model` leaves out the sandbox's own recv arrival (the worker does not know it): a pipeline's
last stage posts its recv after the model's completion (busy with the previous backward), and that shows here as
"late" (session 16: median 6.9-15.7 ms) while its waits were 0.00-0.09 ms past the model at the median (session 17).
`scripts/fidelity_sandbox_gap.py` gives each wait's excess against the model with every arrival counted, and
`prism emulate` writes each exchange's lateness with every arrival counted, per op kind, as
CONFIG/prism0/emulation/delays.parquet (`prism/emulate/delays.py`; its summary prints it).

    python3 scripts/fidelity_sandbox_delay.py DIR/a/dp8 DIR/b/dp8-ep4 ...
"""
import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("| config | op kind | n | vs model ms: median / p95 / max / mean | vs calibrated ms: median / p95 / max |"
          " gated comms, late max / total ms |")
    print("|---|---|---|---|---|---|")
    for folder in map(Path, argv):
        meta = folder / "prism0" / "emulation" / "meta.json"
        if not meta.exists():
            print(f"{folder}: no {meta}", file=sys.stderr)
            return 1
        cone = json.loads(meta.read_text())["emulation"]["cone"]
        for op, d in sorted(cone.get("exchange_late_by_op", {}).items()):
            print(f"| {folder.name} | {op} | {d['n']} | {d['vs_model_median_ms']:.2f} / {d['vs_model_p95_ms']:.2f} / "
                  f"{d['vs_model_max_ms']:.2f} / {d['vs_model_mean_ms']:.2f} | {d['vs_calibrated_median_ms']:.2f} / "
                  f"{d['vs_calibrated_p95_ms']:.2f} / {d['vs_calibrated_max_ms']:.2f} | {cone.get('real_comms_gated')}, "
                  f"{cone.get('gate_late_max_ms', float('nan')):.2f} / {cone.get('gate_late_total_ms', float('nan')):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
