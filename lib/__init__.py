"""What a stage is made of: the algorithm's modules, read with the numbered scripts.

The tree is the design: this folder's top holds what a stage's loop calls, one module a trick,
so that a student reads a stage in its script and here; the harness that runs every stage is
``lib/run/``, and the tools are ``lib/bench/``, ``lib/sweep/`` and ``lib/analysis/``. Nothing
here imports a tool; a module here reaches the run wing only for process hygiene and errors.

The 2017 loop (stages 01-03):

- ``params``: hyperparameters, one dataclass, one named set per game; the observation's shape.
- ``wrappers``: the 2017 Atari wrapper set, and the game in progress; ``make_env`` builds it.
- ``model``: the Nature DQN.
- ``buffer``: the replay ring that stores each frame once.
- ``loss``: the TD loss.
- ``agent``: epsilon-greedy action selection for one game.
- ``schedules``: when things happen: epsilon, the target sync, the run's cadences.
- ``parallel``: the play process of stages 03+ and the messages it sends (03).

What each later stage adds, one module a trick:

- ``staging``: batches sampled into pinned memory for asynchronous copies (04).
- ``wrappers_new``: the OpenCV wrapper set (05).
- ``precision``, ``optimizer``: the learner's bf16 or fp32 and Adam's fastest form (06).
- ``vector_env``, ``vector_play``, ``actor``, ``buffer_games``: ale-py's vector env, the play
  process that drives it, batched acting, and a replay ring a game (07).
- ``replay_device``, ``graph_step``: the replay ring on the device and the train step captured
  as one CUDA graph (08).
"""
