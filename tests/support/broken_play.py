"""Deliberately broken play processes for the whole-run and acting tests
(``tests/test_weights_age.py``, ``tests/test_stages.py``). Each wraps a stage's ``play`` in the
play process, where a test's monkeypatch cannot reach; ``start_inside(monkeypatch, wrap)``
starts every play process of the test that way:

- ``send_stale_frames``: each transition it sends carries the frame before the new one;
- ``frozen_weights``: it acts with a private copy of the weights it was started with, which
  the trainer's updates never reach;
- ``rare_snapshot``: it acts with a private copy refreshed from the trainer's weights every
  ``SNAPSHOT_FORWARDS`` forward passes.
"""

import copy
import dataclasses
import functools

from lib import parallel

SNAPSHOT_FORWARDS = 25  # 07-08 at K=N=4: 25 train steps (a forward a vector step); 03-06 at N=4: about 7


def start_inside(monkeypatch, wrap) -> None:
    """Every play process started from now on runs ``wrap(play, p)`` for ``play(p)`` (``p``: its
    ``parallel.PlayArgs``)."""
    start = parallel.start_player
    inside = functools.partial(functools.partial, wrap)
    monkeypatch.setattr(parallel, "start_player", lambda run, play, args: start(run, inside(play), args))


def send_stale_frames(play, p):
    send, previous = parallel.send, []

    def stale(queue, item, parent_pid):
        frame = previous[0] if previous else item.next_frame
        previous[:] = [item.next_frame.copy()]
        send(queue, item._replace(next_frame=frame), parent_pid)

    parallel.send = stale
    play(p)


def frozen_weights(play, p):
    play(dataclasses.replace(p, net=copy.deepcopy(p.net)))  # a copy's tensors are the process's own, not shared


def rare_snapshot(play, p):
    own, forwards = copy.deepcopy(p.net), []

    def refresh(module, inputs):
        forwards.append(1)
        if len(forwards) % SNAPSHOT_FORWARDS == 0:
            own.load_state_dict(p.net.state_dict())

    own.register_forward_pre_hook(refresh)
    play(dataclasses.replace(p, net=own))
