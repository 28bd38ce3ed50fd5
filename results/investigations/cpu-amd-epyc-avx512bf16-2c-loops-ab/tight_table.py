"""The table of tight.sh's lines: each stage's training f/s per round and tree, the after/before
ratio of each round, and their median.

    python tight_table.py tight.log
"""

import re
import statistics
import sys
from collections import defaultdict

fps = defaultdict(dict)  # (stage) -> {(round, tree): f/s}
for line in open(sys.argv[1]):
    m = re.match(r"(\d) (before|after) (\d\d) RESULT .* fps=([\d.]+)", line)
    if m:
        fps[m.group(3)][(int(m.group(1)), m.group(2))] = float(m.group(4))
rounds = sorted({r for v in fps.values() for r, _ in v})
head = " | ".join(f"before {r} | after {r}" for r in rounds)
print(f"| stage | {head} | after / before, each round | median |")
print("|---|" + "---:|" * (2 * len(rounds)) + "---|---:|")
for stage, v in sorted(fps.items()):
    cells = " | ".join(f"{v[(r, 'before')]:.1f} | {v[(r, 'after')]:.1f}" for r in rounds)
    ratios = [v[(r, "after")] / v[(r, "before")] for r in rounds]
    each = ", ".join(f"{x:.3f}" for x in ratios)
    print(f"| {stage} | {cells} | {each} | {statistics.median(ratios):.3f} |")
