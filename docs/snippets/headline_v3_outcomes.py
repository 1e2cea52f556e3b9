"""The v3 headline's per-problem first-attempt outcomes, from its committed raw data
(reports/headline-v3/runs/*/eval_problems.jsonl.gz); the other scripts here import it."""
import glob
import gzip
import json

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
