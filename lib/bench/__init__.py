"""The benchmark in one command: every stage, the play-steps sweep, and each stage's bound.

``python -m lib.bench [--quick] [--repeat R] [--device auto|cpu|cuda] [--stages 01,05] ...``

The stages run as subprocesses of this Python, one at a time (they must not share the cores),
in interleaved rounds: 01, 02, ..., 07, then stage 02 with N = 1..6, then all of it again, so
that a machine that speeds up or slows down during the bench moves every stage alike. Right
before each stage's run, the parts that bound it are measured in this process with that
stage's own code, so that its efficiency (f/s over bound) compares like with like. Each
figure is reported as the median over rounds with its min-max; each ratio is taken within a
round first.

Modules, by concern:

- ``machine``: facts about this machine and this code (tag, CPU, memory, versions, load).
- ``launch``: one stage run as a subprocess in its own process group, its output parsed.
- ``bounds``: a stage's bound from the registry (formula and its text), the greedy share.
- ``parts``: measuring the parts of a bound with the stage's own build, train_step and acting.
- ``floor``: a train step's arithmetic floor on this device (its FLOPs over a large matmul's rate).
- ``trainstep``: stage 08's train step timed in each form (eager, CUDA graph, compiled) against its floor.
- ``rounds``: the plan of runs in rounds, running it, and the medians, spreads and ratios.
- ``report``: the results folder (CSV files, meta.json) and the console table.
- ``markdown``: the results folder's report, README.md.
- ``charts``: the two charts, with the spread as error bars.
- ``table``: the stage tables of the README and docs/measurements.md from chosen results folders
  (``python -m lib.bench.table``).
- ``command``: the command line, its checks, and ``main``.
"""

from lib.bench.command import main

__all__ = ["main"]
