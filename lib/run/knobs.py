"""The stage knobs: the flags that some stages have and others not (``Stage.knobs`` lists a
stage's). Each is declared here once, with how its text is read, its default and its help; the
stage's command line (``lib.run.stage_args``), the run's checks and its resume, the sweep's check of
the flags it passes on, and the bench all read it from here. A knob's ``resolve`` is what a
value means on a device (``resolve_capture``: stage 08's rule for ``--capture auto``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from lib.precision import CHOICES as PRECISIONS
from lib.precision import resolve_precision
from lib.run import cli
from lib.run.cores import auto_envs


@dataclasses.dataclass(frozen=True)
class Knob:
    """A stage's own flag ``--<name>`` (``args.<name>``)."""

    name: str
    parse: Callable[[str], Any]  # command-line text -> value (argparse's type), ArgumentTypeError when out of bounds
    default: Any  # the value of a stage that has the knob when the flag is not given
    unset: Any  # how a stage without the knob runs: its args hold this value
    help: str
    choices: tuple | None = None  # the values allowed, where they are a list
    # (value, device type) -> the value a run on that device runs with; ValueError where the
    # device cannot run it
    resolve: Callable[[Any, str], Any] = lambda value, device_type: value  # most knobs: as given
    # True: checkpoints save the value as given (``auto`` included), so that a run resumed on
    # another device resolves it there again (``--precision``: bf16 where that device has it;
    # ``--capture``: graph on CUDA); False: they save the resolved value (``--envs``: the replay
    # ring's layout follows it)
    per_device: bool = False


def resolve_capture(value: str, device_type: str) -> str:
    """``--capture`` as a run on ``device_type`` uses it: ``auto`` is ``graph`` on CUDA and
    ``none`` elsewhere. ValueError for an unknown form, and for ``graph`` off CUDA."""
    if value == "auto":
        return "graph" if device_type == "cuda" else "none"
    if value not in KNOBS["capture"].choices:
        raise ValueError(f"unknown capture {value!r} (known: {', '.join(KNOBS['capture'].choices)})")
    if value == "graph" and device_type != "cuda":
        raise ValueError("--capture graph needs CUDA (use --capture none on CPU)")
    return value


def _envs_kept(value, device_type: str) -> int:
    """``--envs`` as a run keeps it: ``auto`` becomes this device's number of games."""
    return auto_envs(device_type) if value == "auto" else value


# ``--lag``: free, the play process's way in 2017 (03+); zero, held to stage 02's weights
# (``lib.run.probes.weights_age.WeightsAge``, whose counters it waits on). 01-02 act in the trainer's own
# process, at zero lag by construction.
LAGS = ("free", "zero")

KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("steps", cli.positive, default=4, unset=1, help="env steps per train step (batch 32*N)"),
        Knob("envs", cli.positive_or_auto, default="auto", unset=1,
             help="games played side by side (auto: 4 on CPU, 2 per play thread on CUDA)", resolve=_envs_kept),
        Knob("capture", str, default="auto", unset="none", help="auto: graph on CUDA",
             choices=("auto", "none", "graph", "compile"), resolve=resolve_capture, per_device=True),
        Knob("precision", str, default="auto", unset="fp32",
             help="the learner's arithmetic: bf16 autocast (fp32 weights and Q head) or plain fp32; "
                  "auto: bf16 where the device computes it natively, fp32 where torch would emulate it",
             choices=PRECISIONS, resolve=resolve_precision, per_device=True),
        Knob("lag", str, default="free", unset="zero", choices=LAGS,
             help="the weights the play process acts with: free: the trainer's live weights while play runs "
                  "ahead by up to the Queue's depth (2-3 train steps old, as in 2017); zero: play waits before "
                  "each action for the train steps stage 02 would have done by then (02's weights; play and "
                  "learning no longer overlap)"),
    )
}  # fmt: skip
