"""Share of seed × problem cells of the v3 headline's final evaluations where two arms' first attempts differ,
from the committed raw data: `python docs/snippets/differing_cells.py mlmt-oracle mlmt`."""
import glob
import gzip
import json
import sys

import numpy as np


def final_t1(arm: str) -> np.ndarray:
    """[10 seeds, 500 problems] first-attempt correctness (0/1) at each run's last evaluation."""
    rows = []
    for s in range(10):
        (path,) = glob.glob(f"reports/headline-v3/runs/headline-v3-{arm}-s{s}-*/eval_problems.jsonl.gz")
        recs = [json.loads(line) for line in gzip.open(path, "rt")]
        last = max(r["step"] for r in recs)
        by = {r["problem_id"]: float(r["t1"]) for r in recs if r["step"] == last}
        rows.append([by[k] for k in sorted(by)])
    return np.array(rows)


a, b = final_t1(sys.argv[1]), final_t1(sys.argv[2])
print(f"{sys.argv[1]} vs {sys.argv[2]}: first attempts differ on {100 * (a != b).mean():.1f}% of {a.size} cells")
