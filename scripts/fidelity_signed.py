"""Mean signed and mean |error| of the prediction (median of its runs against the median truth) over the configs of
one or more `prism bench fidelity` JSON files (docs/fidelity.md, session 16):

    python3 scripts/fidelity_signed.py A.json [B.json ...]
"""
import json, statistics, sys
e = [100 * (statistics.median(r["pred_ms"]) - statistics.median(r["truth_ms"])) / statistics.median(r["truth_ms"])
     for f in sys.argv[1:] for r in json.load(open(f))]
print(len(e), f"mean signed {sum(e) / len(e):+.1f} %, mean |error| {sum(map(abs, e)) / len(e):.1f} %")
