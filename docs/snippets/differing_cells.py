"""Share of seed × problem cells of the v3 headline's final evaluations where two arms' first attempts differ,
from the committed raw data: `python docs/snippets/differing_cells.py mlmt-oracle mlmt`."""
import sys

from headline_v3_outcomes import final_t1

a, b = final_t1(sys.argv[1]), final_t1(sys.argv[2])
print(f"{sys.argv[1]} vs {sys.argv[2]}: first attempts differ on {100 * (a != b).mean():.1f}% of {a.size} cells")
