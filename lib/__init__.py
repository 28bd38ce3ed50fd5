"""Shared machinery of the dqn-speedup stages.

Small single-purpose modules: ``params`` (hyperparameters), ``wrappers`` (the two Atari
wrapper sets), ``model`` (Nature DQN), ``buffer`` (replay), ``loss`` (TD loss and pinned
staging), ``tracking`` (epsilon, rewards, speed, TensorBoard), ``runner`` (command line,
run folder, signals, checkpoints), ``parallel`` (the play process of stages 03+).
"""
