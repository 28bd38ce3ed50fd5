"""Many runs at once: stages x seeds x games, on this machine or on an existing Ray cluster.

``python -m lib.sweep --stages 05,06,07 --seeds 0-4 --games pong --max-frames 1000000
[--per-run-cpus C] [--per-run-gpus G] [--address HOST:PORT] [--out DIR] [--no-save-replay] [-- STAGE FLAGS]``,
``python -m lib.sweep --report --out DIR``

Each run is one stage script started exactly as a user would start it (``python NN_name.py
--seed S --game G --max-frames F --run-dir DIR --save-every X --quiet --progress SEC``), so a
sweep measures the same code as a single run. Flags after a lone ``--`` go to every run
(``-- --replay-initial 1000``); a stage's own knob (``--steps``, ``--envs``) goes only to the
stages that have it. The flags the sweep sets itself cannot be passed through.

Where runs go:
- this machine (the default, no extra dependency): runs start side by side while the cores and
  GPUs allow (``--per-run-gpus 0.25`` packs four runs on one GPU), the rest wait their turn;
  every run is a process group of its own, ended on Ctrl-C or SIGTERM;
- ``--address HOST:PORT``: each run is a Ray task on that existing cluster, asking for the
  given CPUs and GPUs (``pip install -e ".[cluster]"`` on every node, same commit). Nothing is
  shared but Ray's object store: a run's files travel back to the driver as bytes.
The code that starts a run, watches it and brings its files back (``execute``) and the code
that files the outcome (``Sweep``) are the same for both.

The output folder (``--out``, default ``runs/sweep``)::

    README.md      command, commit, hardware, wall time, the runs, seed statistics, verdict,
                   and the folder's NOTES.md where it has one
    curves.png     reward_100 per stage, mean over seeds with a 95% bootstrap band (lib.analysis.curves)
    sweep.json     the grid, each run's state, the invocations
    runs/<stage>-<game>-seed<S>/   summary.json, the event files, run.log, checkpoint.pt, best.pt,
                   replay-<frame>.pt (the ring its checkpoint names; gone once the run is solved)

Running the same command again skips finished runs and continues unfinished ones from their
checkpoint (a larger ``--max-frames`` lets finished runs grow), with the replay ring the
checkpoint holds where the disk had room for it (``rings``), so that a resume refills nothing;
the README counts each run's resumes and the frames it played untrained after them. ``--report --out DIR`` runs
nothing: it writes the folder's README.md and seed statistics again, with this code, from its
sweep.json (the grid, each run's state, the last invocation's facts) and its run folders. A run whose process or node dies
is retried once, from the last checkpoint the driver received, then reported failed with its log.
Bad input (an unknown stage or game, an empty seed range, a nonsense number, a bad address, a
stage flag no stage takes) gets one line on stderr and exit code 2, and nothing starts. Exit
code 1 when a run failed, 130 / 143 on Ctrl-C / SIGTERM.

Modules, by concern:

- ``grid``: the runs of the grid (``RunSpec``) from the flags, their state in the driver
  (``Job``), and what a run's folder says is finished.
- ``launch``: one run, on this machine or a Ray node: the stage in its own process group,
  followed (``execute``), its files brought back as bytes.
- ``local_pool``: the runs on this machine, packed by cores and GPU shares.
- ``ray_pool``: the runs as tasks on a Ray cluster (ray is imported only there).
- ``rings``: the runs' replay rings: the room for them, linked rather than sent as bytes.
- ``driver``: ``Sweep``, which starts, follows, retries, stops and files the runs through a pool.
- ``report``: the progress line, README.md, sweep.json and the seed statistics.
- ``command``: the command line, its checks, and ``main``.
"""

import importlib

# Loaded on first use: a Ray worker that runs ``ray_pool``'s task imports this package, and
# needs neither torch nor matplotlib to launch a stage.
_HOME = {
    "main": "command", "parse_args": "command", "Sweep": "driver", "RunSpec": "grid", "parse_seeds": "grid",
    "plan": "grid", "child_env": "launch", "clear_stale": "launch", "execute": "launch", "LocalPool": "local_pool",
    "RayPool": "ray_pool",
}  # fmt: skip
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'lib.sweep' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lib.sweep.{_HOME[name]}"), name)
