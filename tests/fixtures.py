"""Where the tests' committed data lives: `tests/data/`. One helper, so that a test names a fixture, not a path.

- `data(*parts)`: a file or folder under `tests/data/` (a clear error when it is missing);
- `fidelity_truths()`: the truth runs of the fidelity bench kept as fixtures, `tests/data/fidelity/<name>/graph/`
  (``events.parquet``: the columns `prism.calibrate.stage.load_graph` reads; ``comms.parquet``), one per config
  and device run (`docs/fidelity.md`, "The model on the truth's own inputs", says where they come from).
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


def data(*parts: str) -> Path:
    path = DATA.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"test fixture {path} is missing: it is committed under tests/data/ (git checkout it)")
    return path


def fidelity_truths() -> list[Path]:
    """The job folders (each holding graph/) of the committed truth runs, sorted by name."""
    found = sorted(p.parent for p in data("fidelity").glob("*/graph"))
    if not found:
        raise FileNotFoundError(f"no truth fixture under {DATA / 'fidelity'}")
    return found
