"""The emulation's own delay per op kind for every prism run of device calls (issue 24 item 3, session 19): each run's
`emulation/delays.parquet` (`prism/emulate/delays.py`: how late each real exchange with replayed ranks completed
against the model), one row per run and op kind, beside the lateness summed per iteration as % of the scored
rank's predicted iteration (`emulated[i].pred_rank_ms` of the stream's fidelity.json).

    python3 scripts/sandbox_delays_table.py F1/a F1/b F2/a ...      (a device call's streams, unpacked)

A stream folder's name and its parent's ("call1/a") label the rows. Nothing here feeds a prediction.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq


def rows(stream: Path) -> list[str]:
    out = []
    label = f"{stream.parent.name}/{stream.name}"
    for record in json.loads((stream / "fidelity.json").read_text()):
        variants = record.get("variant") or ["none"] * len(record.get("pred_ms") or [])
        for i, em in enumerate(record.get("emulated") or []):
            path = stream / record["config"] / f"prism{i}" / "emulation" / "delays.parquet"
            if not path.is_file() or em.get("pred_rank_ms") is None:
                continue
            for d in pq.read_table(path).to_pylist():
                share = 100.0 * d["late_ms_per_iteration"] / em["pred_rank_ms"]
                out.append(f"| {label} | {record['config']} | {i} | {variants[i] if i < len(variants) else 'none'} | "
                           f"{d['op']} | {d['n']} | {d['late_median_ms']:.2f} | {d['late_p95_ms']:.2f} | "
                           f"{d['late_max_ms']:.2f} | {d['late_ms_per_iteration']:.2f} | {share:.1f} |")
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print("| call/stream | config | run | variant | op | n | late ms median | p95 | max | late ms per iteration | "
          "of the rank's predicted iteration % |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for d in argv:
        print("\n".join(rows(Path(d))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
