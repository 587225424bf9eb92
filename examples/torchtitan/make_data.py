"""A small local text corpus in the layout torchtitan's `c4_test` loader reads (DIR/data.json, one JSON
object with a "text" field per line): torchtitan's wheel ships no test assets, and this machine reaches no
dataset hub. Deterministic (a fixed seed), so every run of a job sees the same tokens.

Run: python examples/torchtitan/make_data.py OUT_DIR
"""

import json
import random
import sys
from pathlib import Path

WORDS = ("the model trains on text from many sources and every rank reads its own shard of the data while "
         "the optimizer updates parameters after each step of gradient descent across devices and nodes in "
         "a cluster where communication overlaps compute so that scaling stays efficient for large jobs").split()


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    with open(out / "data.json", "w") as f:
        for _ in range(2000):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(200, 400)))}) + "\n")


if __name__ == "__main__":
    main()
