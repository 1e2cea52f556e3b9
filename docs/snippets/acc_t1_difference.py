"""acc@t1 of arm A minus arm B on the v3 headline's final evaluations, two-way bootstrap over seeds and problems
(METHOD v3), from the committed raw data: `python docs/snippets/acc_t1_difference.py mlmt grpo`."""
import glob
import gzip
import json
import sys

import numpy as np

from mlmt_bench.metrics.twoway import twoway_paired


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


r = twoway_paired(final_t1(sys.argv[1]), final_t1(sys.argv[2]))
print(f"{sys.argv[1]} - {sys.argv[2]} acc@t1: {100 * r['diff']:+.1f} [{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}] "
      f"p {r['p_value']:.3f} MDE {100 * r['mde']:.1f}")
