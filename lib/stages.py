"""The registry of stages: what each numbered script is, in one place.

The bench, the sweep, the tests and the stage table of docs/stages.md read this list; a new stage touches its
script and one entry here. A stage's bound on a machine follows from its fields: which wrapper
set its env steps cost (``wrappers``), which train step its learner runs (``learner``), how its
batches reach that step (``sampling``), and whether play shares the trainer's process
(``play``: ``inline``), runs beside it (``process``) or drives a native vector env beside it
(``vector``). The bench times those parts with the stage's own code, through the contract that
every script keeps (``load_script``).

The stage knobs (``KNOBS``) are the flags that some stages have and others not. Each is
declared here once, with how its text is read, its default and its help; the stage's command
line (``make_parser``), the run's checks and its resume, the sweep's check of the flags
it passes on, and the bench all read it from here, and a stage lists the knobs it has.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from lib import cli
from lib.cores import auto_envs
from lib.params import GAMES
from lib.precision import CHOICES as PRECISIONS
from lib.precision import resolve_precision

ROOT = cli.ROOT  # the folder of the stage scripts

ARTICLE_HW = "GTX 1080Ti, 2017"
# The article's stage-02 table: f/s against play steps N (batch 32*N).
ARTICLE_SWEEP = {1: 154, 2: 200, 3: 212, 4: 227, 5: 228, 6: 232}
# The article's time to solve Pong (a mean of the last 100 games above 18), in minutes, for the
# two stages it gives one: the basic version in 60-90 minutes, the final one in 20-30, each
# "depending on the seed". In frames at the stage's article f/s: ``article_solve_frames``.
ARTICLE_SOLVE_MINUTES = {"01": (60, 90), "05": (20, 30)}


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
    )
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Stage:
    id: str  # "01": the script's number, also its run folders' prefix
    script: str  # file name in ROOT
    name: str  # short name in tables
    adds: str  # what it adds over the stage before it, one line
    article_fps: int | None  # the article's figure (GTX 1080Ti, 2017), None where not in it
    wrappers: str  # "old", "new" or "vector": the env it plays
    learner: str  # "fp32", "bf16" or "graph" (bf16, sampled on the device, captured): its train step
    # How a batch reaches the train step: "host" (``buffer.sample``), "pinned" (sampled into
    # pinned buffers by a ``PinnedStager``, copied without waiting), "device" (drawn on the device)
    sampling: str
    play: str  # "inline" (same process), "process" (a play process), "vector" (play process, vector env)
    knobs: tuple[str, ...] = ()  # the stage's own flags beyond the common ones: names of KNOBS
    gist: str = ""  # what it adds, in a few words: the README's stage table

    @property
    def path(self) -> str:
        return os.path.join(ROOT, self.script)

    @property
    def module(self) -> str:
        """Import name of the script (the repository root on sys.path): ``03_parallel``."""
        return self.script[: -len(".py")]


STAGES: dict[str, Stage] = {
    s.id: s
    for s in (
        Stage("01", "01_dqn_basic.py", "basic",
              "the plain loop: one env step, one train step on 32 transitions",
              154, "old", "fp32", "host", "inline", gist="the plain loop"),
        Stage("02", "02_play_steps.py", "play steps",
              "`--steps N` env steps per train step on a batch of 32*N (N=4)",
              227, "old", "fp32", "host", "inline", ("steps",), gist="4 env steps a train step"),
        Stage("03", "03_parallel.py", "parallel",
              "playing in its own process; transitions over a bounded `torch.multiprocessing` Queue, the play process at most 2*N transitions ahead",
              395, "old", "fp32", "host", "process", ("steps",), gist="play in its own process"),
        Stage("04", "04_cuda_async.py", "cuda async",
              "batches sampled into reused pinned buffers, copied with `non_blocking=True`",
              406, "old", "fp32", "pinned", "process", ("steps",), gist="copies without waiting"),
        Stage("05", "05_new_wrapper.py", "new wrappers",
              "the newer OpenCV wrapper set (cv2 grey + 84x84 resize on uint8, two-frame max buffer)",
              484, "new", "fp32", "pinned", "process", ("steps",), gist="OpenCV wrappers"),
        Stage("06", "06_bf16_learner.py", "bf16 learner",
              "bf16 autocast (fp32 master weights, fp32 Q head), channels_last, target under `inference_mode`, "
              "fused Adam",
              None, "new", "bf16", "pinned", "process", ("steps", "precision"), gist="bf16, fused Adam"),
        Stage("07", "07_vector_play.py", "vector play",
              "`--envs K` games in ale-py's native vector env, batched action selection",
              None, "vector", "bf16", "pinned", "vector", ("steps", "envs", "precision"), gist="K games, batched acting"),
        Stage("08", "08_graph_learner.py", "graph learner",
              "the replay ring on the device; the whole train step captured as one CUDA graph (`--capture`)",
              None, "vector", "graph", "device", "vector", ("steps", "envs", "capture", "precision"),
              gist="train step as a CUDA graph"),
    )
}  # fmt: skip


def article_solve_frames(stage: str) -> tuple[int, int]:
    """The article's frames to solve Pong for ``stage`` (01: 554,400-831,600; 05: 580,800-871,200):
    its minutes times its f/s. KeyError for a stage the article gives no solve time for."""
    low, high = ARTICLE_SOLVE_MINUTES[stage]
    fps = STAGES[stage].article_fps
    return low * 60 * fps, high * 60 * fps


def make_parser(stage: str, description: str | None) -> cli.Parser:
    """The command-line contract every stage keeps, and the stage's own knobs (the registry's).
    A knob the stage does not have is no flag, and its value is the knob's ``unset``."""
    p = cli.Parser(description=(description or "").split("\n\n")[0], prog=STAGES[stage].script)
    cli.add_device(p)
    p.add_argument("--cuda", action="store_true", help="shorthand for --device cuda")
    p.add_argument("--game", default=None, help=f"hyperparameter set: {', '.join(GAMES)} (default pong)")
    p.add_argument("--env", default=None, help="gymnasium env id to use instead of the game's")
    p.add_argument("--seed", type=cli.seed, default=0, help="seeds python, numpy, torch and the env")
    p.add_argument("--max-frames", type=cli.positive, default=None, help="stop after N agent steps")
    p.add_argument("--replay-initial", type=cli.positive, default=None, help="transitions before training")
    p.add_argument("--replay-size", type=cli.positive, default=None, help="replay buffer capacity")
    p.add_argument("--run-dir", default="runs", help="TensorBoard root; one sub-folder per run")
    p.add_argument("--save-every", type=cli.positive, default=None, help="checkpoint every N agent steps")
    p.add_argument("--resume", default=None, metavar="PATH", help="continue from a checkpoint")
    p.add_argument(
        "--save-replay",
        action="store_true",
        help="checkpoints also hold the replay buffer and the game in progress, so --resume loses nothing",
    )
    p.add_argument("--quiet", action="store_true", help="no per-game lines")
    p.add_argument(
        "--progress", type=cli.positive_float, default=None, metavar="SEC", help="a PROGRESS line every SEC s"
    )
    for knob in KNOBS.values():
        if knob.name in STAGES[stage].knobs:
            p.add_argument(
                f"--{knob.name}", type=knob.parse, default=knob.default, choices=knob.choices, help=knob.help
            )
        else:
            p.set_defaults(**{knob.name: knob.unset})
    return p


def load_script(stage_id: str):
    """The stage's script as a module (``03_parallel``), imported from ROOT, so that the bench
    times a stage with the stage's own code. Every script keeps this contract
    (``tests/test_stages.py`` checks it):

    - ``STAGE``, its id, and ``main(argv=None)``, its run: ``runner.main(STAGE, __doc__, train, argv)``;
    - a learner on the host (``sampling`` host or pinned): ``build(shape, n_actions, params,
      device)`` -> (net, tgt_net, optimizer), and ``train_step(batch, net, tgt_net, optimizer,
      params, device)`` -> the loss, one update on a sampled batch;
    - a learner on the device (``sampling`` device): ``build(shape, n_actions, params, device,
      envs, steps, capture)`` -> (net, tgt_net, optimizer, buffer, train_step): the replay
      rings on the device and ``train_step(frame_idx)``, which samples from them;
    - a stage with the ``precision`` knob takes it as one more parameter, last, of its
      ``train_step`` (host) or ``build`` (device), defaulting to the knob's default.
    """
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    return importlib.import_module(STAGES[stage_id].module)


def parse_stages(text: str) -> list[str]:
    """'1,05, 7' -> ['01', '05', '07'] (sorted, no repeats); ValueError naming the bad part."""
    out = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or f"{int(part):02d}" not in STAGES:
            raise ValueError(f"unknown stage {part!r} (known: {','.join(STAGES)})")
        out.add(f"{int(part):02d}")
    return sorted(out)


def markdown_table() -> str:
    """The table of stages in docs/stages.md, from the registry (``python -m lib.stages`` prints it)."""
    base = STAGES["01"].article_fps
    lines = [
        f"| script | adds over the previous one | article f/s ({ARTICLE_HW}) | vs 01 |",
        "|---|---|---|---|",
    ]
    for s in STAGES.values():
        fps, ratio = ("—", "—") if s.article_fps is None else (str(s.article_fps), f"{s.article_fps / base:.2f}")
        lines.append(f"| `{s.script}` | {s.adds} | {fps} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
