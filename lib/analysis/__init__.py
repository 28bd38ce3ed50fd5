"""Reading what runs left: learning curves, seed statistics, the 2017 run, and a net at play.

- ``curves``: learning curves of runs, and of seeds with their spread (``dqn-curves``).
- ``run_folders``: run folders as the curves read them: which runs, their reward_100 curves.
- ``seed_stats``: seed statistics: mean bands, frames to each level, the permutation-test verdict.
- ``reference``: the 2017 basic DQN's own log, the line every curve is set beside.
- ``watch``: a saved network playing real games, with video (``dqn-watch``).
"""
