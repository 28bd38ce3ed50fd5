"""The table of ab.sh's four bench folders: f/s per stage and round, before and after, and the
after/before ratio of each round with their median.

    python compare.py OUT
"""

import csv
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1])


def fps(tag):
    with open(out / tag / "fps.csv") as f:
        return {row["stage"]: float(row["fps"]) for row in csv.DictReader(f)}


runs = {tag: fps(tag) for tag in ("before-1", "after-1", "before-2", "after-2")}
print(
    "| stage | before, round 1 | after, round 1 | before, round 2 | after, round 2 | after / before, each round | median |"
)
print("|---|---:|---:|---:|---:|---|---:|")
for stage in sorted(runs["before-1"]):
    ratios = [runs[f"after-{r}"][stage] / runs[f"before-{r}"][stage] for r in (1, 2)]
    cells = " | ".join(f"{runs[t][stage]:.1f}" for t in ("before-1", "after-1", "before-2", "after-2"))
    each = ", ".join(f"{x:.3f}" for x in ratios)
    print(f"| {stage} | {cells} | {each} | {statistics.median(ratios):.3f} |")
