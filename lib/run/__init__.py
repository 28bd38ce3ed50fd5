"""The run's skeleton: what every stage shares to run, and no part of the algorithm.

A numbered script knows this wing through one API, ``Run`` (``lib.run.runner``): see its
docstring. The modules, by concern:

- ``runner``: a stage's run: the run folder, the frame loop's services, and ``main``.
- ``stages``, ``knobs``, ``stage_args``, ``scripts``: the registry of stages, the flags some
  stages have and others not, a stage's command line, and the numbered scripts as modules.
- ``cli``: what every command shares: errors and exit codes, argument types, device, checks.
- ``checkpoint``, ``resume``, ``ring_files``: the files a run writes to go on from or to play,
  what they belong to, and replay rings in their files.
- ``summary``, ``events``: what a run leaves at its end (summary.json, TIME and RESULT lines)
  and its TensorBoard writer.
- ``probes`` (a package): the run's measurements (speed, reward, loss, best.pt, time by part,
  the weights' age, dead units); ``timing``: the part clocks they read.
- ``runtime``: what every process of a stage sets first, and its seeding.
- ``signals``, ``procs``, ``runlock``, ``disk``, ``memory``, ``cores``: the process and the
  machine: signals, child processes, one run per folder, a full disk, memory, threads.
"""
