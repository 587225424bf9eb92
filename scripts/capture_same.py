"""Whether two captures of one job recorded the same thing (issue 25 item 2: before/after a change to what a
rank holds): per rank its events (what, not when), its payload index (content hashes), its groups, and the
job's payload files. Prints one line; exit 0 when equal, 1 when not (the first rank that differs).

    .venv/bin/python scripts/capture_same.py JOB_A JOB_B
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.test_capture_hosts import _what_ranks_did  # noqa: E402  (the two-host test's comparison)


def main() -> int:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    a, b = (Path(p) for p in sys.argv[1:])
    ranks_a, ranks_b = _what_ranks_did(a), _what_ranks_did(b)
    files_a, files_b = (sorted(p.name for p in (j / "payloads").rglob("*.bin")) for j in (a, b))
    events = sum(len(v[0]) for v in ranks_a.values())
    if ranks_a == ranks_b and files_a == files_b:
        print(f"same: {len(ranks_a)} ranks, {events} events, {len(files_a)} payload files, "
              f"{sum(len(v[2]) for v in ranks_a.values())} group rows")
        return 0
    differ = next((r for r in sorted(set(ranks_a) | set(ranks_b)) if ranks_a.get(r) != ranks_b.get(r)), "payloads")
    print(f"different: first at {differ}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
