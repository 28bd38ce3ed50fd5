"""Shared machinery of the dqn-speedup stages, one concern per module.

The stages and their skeleton:

- ``stages``: the registry of stages (script, name, article figure, wrapper set, learner, knobs).
- ``knobs``: the flags some stages have and others not, and what each means on a device.
- ``stage_args``: a stage's command line (the flags every stage shares, and its knobs).
- ``scripts``: the numbered scripts as modules, and the contract each keeps.
- ``runner``: a stage's run: validation, run folder, the frame loop, and ``main``, its entry point.
- ``summary``: what a run leaves at its end: summary.json and the TIME and RESULT lines.
- ``schedules``: when things happen: epsilon, the target sync, the run's cadences.
- ``events``: the run's TensorBoard writer.
- ``probes`` (a package): the run's measurements, one module each: ``trackers`` (speed, reward
  and loss), ``best_model`` (best.pt), and, attached by ``Run`` as the registry says,
  ``time_by_part``, ``weights_age`` (of the weights the play process acts with) and
  ``dead_units`` (the check that ends a run whose net has a layer no state makes active).
- ``timing``: the mechanism of time by part: part clocks, timed stand-ins, and which part bounds a run.
- ``checkpoint``: the files a run writes to go on from or to play (kinds, contents, atomic writes).
- ``resume``: what a checkpoint and a replay file belong to, and which stage can resume them.
- ``ring_files``: a replay ring in its file, and 07's rings and 08's converted on resume.
- ``disk``: a write and a full disk: room checked before, the OS's reason after.
- ``runtime``: what every process of a stage sets first (subnormal flush, malloc) and its seeding.
- ``cli``: what every command shares: errors and exit codes, argument types, device, checks.
- ``params``: hyperparameters, one dataclass, one named set per game; the observation's shape.
- ``memory``: what a run needs of the machine's memory, checked before it starts.
- ``cores``: how a run's cores are shared (trainer and play threads) and ``--envs auto``.

What a stage is made of:

- ``wrappers``: the two Atari wrapper sets and ale-py's vector env; the game in progress.
- ``model``: the Nature DQN.
- ``buffer``: the replay ring that stores each frame once, one ring or one per game, and the
  pinned buffers batches are sampled into for asynchronous copies (stage 04).
- ``loss``: the TD loss.
- ``optimizer``: Adam's options: the fastest implementation (stage 06), capturable (stage 08).
- ``precision``: the learner's bf16 or fp32 (stages 06-08), and what ``--precision auto`` is on a device.
- ``agent``: epsilon-greedy action selection, for one game and for a batch of games (``Actor``:
  stages 07-08's, with one host round trip per call on a GPU).
- ``parallel``: the play process of stages 03+ and the messages it sends.
- ``replay_device``, ``graph_step``: stage 08's replay ring on the device and the capture of its train step.

Commands:

- ``procs``: stage scripts as child processes of a command, ended with nothing left behind.
- ``bench`` (a package): the article's table on this machine, in rounds, with bounds.
- ``sweep`` (a package): many runs (stages x seeds x games) on this machine or a Ray cluster.
- ``curves``: learning curves of runs, and of seeds with their spread (the command).
- ``run_folders``: run folders as the curves read them: which runs, their reward_100 curves.
- ``seed_stats``: seed statistics: mean bands, frames to each level, the permutation-test verdict.
- ``watch``: a saved network playing real games.
"""
