"""acc@t1 of arm A minus arm B on the v3 headline's final evaluations, two-way bootstrap over seeds and problems
(METHOD v3), from the committed raw data: `python docs/snippets/acc_t1_difference.py mlmt grpo`."""
import sys

from headline_v3_outcomes import final_t1

from mlmt_bench.metrics.twoway import twoway_paired

r = twoway_paired(final_t1(sys.argv[1]), final_t1(sys.argv[2]))
print(f"{sys.argv[1]} - {sys.argv[2]} acc@t1: {100 * r['diff']:+.1f} [{100 * r['lo']:+.1f}, {100 * r['hi']:+.1f}] "
      f"p {r['p_value']:.3f} MDE {100 * r['mde']:.1f}")
