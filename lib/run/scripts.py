"""The numbered scripts as modules, and the contract each keeps for the bench and the tests."""

from __future__ import annotations

import importlib
import os
import sys

from lib.run.cli import UsageError
from lib.run.stages import ROOT, STAGES


def load_script(stage_id: str):
    """The stage's script as a module (``03_parallel``), imported from ROOT, so that the bench
    times a stage with the stage's own code. Every script keeps this contract
    (``tests/test_stages.py`` checks it):

    - ``STAGE``, its id, and ``main(argv=None)``, its run: ``runner.main(STAGE, __doc__, train, argv)``;
    - a learner on the host (``sampling`` host or pinned): ``build(shape, n_actions, params,
      device)`` -> (net, tgt_net, optimizer), and ``train_step(batch, net, tgt_net, optimizer,
      params, device)`` -> the loss, one update on a sampled batch;
    - a learner on the device (``sampling`` device): ``build(shape, n_actions, params, device,
      envs, capture)`` -> (net, tgt_net, optimizer, buffer), the replay rings on the device, and
      ``train_step(buffer, batch_size, net, tgt_net, optimizer, params, device)`` -> the loss,
      one update on a batch it draws from them, which ``lib.graph_step.capture`` wraps;
    - a stage with the ``precision`` knob takes it as one more parameter, last, of its
      ``train_step``, defaulting to the knob's default.
    """
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    return importlib.import_module(STAGES[stage_id].module)


def require_scripts(command: str) -> None:
    """UsageError unless the numbered scripts are beside this lib, as in a checkout: ``command``
    (the bench, the sweep) runs them, and an installed copy of lib (``pip install .``) has none."""
    missing = [stage.script for stage in STAGES.values() if not os.path.isfile(stage.path)]
    if len(missing) == len(STAGES):
        raise UsageError(
            f"{command} runs the numbered stage scripts, which an installed copy of lib does not carry (none in "
            f"{ROOT}): run it from a checkout of dqn-speedup, installed there with pip install -e ."
        )
    if missing:
        raise UsageError(f"stage scripts not found: {', '.join(missing)}")
