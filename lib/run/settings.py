"""A run's settings, made once: the command line (and, on a resume, the checkpoint) checked and
turned into one frozen ``Settings``, before anything is created.

``settle(stage, args, given)`` is the one place a stage's settings are decided: the game and
its hyperparameters, the device, each knob as the run keeps it on that device, what a resume
takes from its checkpoint and what it was given again. Bad input is a UsageError (one line,
exit 2); nothing is written. ``Run`` holds the result (``run.settings``) and summary.json saves
it whole (``Settings.record``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch

from lib import precision
from lib.params import GAMES, Hyperparams
from lib.run import checkpoint, cli, env_check, memory, resume
from lib.run.checkpoint import load_checkpoint
from lib.run.cli import UsageError
from lib.run.knobs import KNOBS
from lib.run.stages import STAGES


class Args(argparse.Namespace):
    """The command line as the run keeps it: each knob resolved, a resume's saved values taken
    where not given again; read-only once settled (``freeze``)."""

    def freeze(self) -> Args:
        object.__setattr__(self, "_frozen", True)
        return self

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False):
            raise AttributeError(f"a run's settings are made once: --{name.replace('_', '-')} cannot change")
        super().__setattr__(name, value)

    def public(self) -> dict:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a run runs with, decided before it starts."""

    stage: str
    args: Args  # the command line as the run keeps it
    given: frozenset[str]  # the long options the command line gave (``cli.Parser.parse_given``)
    game: str
    params: Hyperparams  # the game's, the checkpoint's on a resume, with --env and the replay sizes given
    device: torch.device
    start_frame: int  # 0, or the checkpoint's frame
    ckpt: dict | None = dataclasses.field(repr=False)  # the checkpoint a resume goes on from
    changed: dict  # on a resume: {name: (saved, given again)}
    saved_knobs: dict  # what checkpoints save of each knob (``Knob.per_device``: as given)
    notice: str | None  # a line a resume prints (bf16 emulated here)
    replay: dict | None = dataclasses.field(repr=False)  # the saved ring a resume goes on with, read and checked

    def record(self) -> dict:
        """The settings as summary.json saves them."""
        args = {
            k: (str(v) if not isinstance(v, (bool, int, float, str, type(None))) else v)
            for k, v in self.args.public().items()
        }
        return {
            "args": args,
            "given": sorted(self.given),
            "game": self.game,
            "device": str(self.device),
            "start_frame": self.start_frame,
            "knobs_saved": dict(self.saved_knobs),
        }


def settle(stage: str, args: argparse.Namespace, given=frozenset()) -> Settings:
    """Check the command line ``args`` of ``stage`` (and the checkpoint of --resume) and decide
    the run's settings; UsageError for bad input. ``args`` is left as it was."""
    args = Args(**vars(args))
    ckpt = load_checkpoint(args.resume) if args.resume else None
    changed = checkpoint.resume_settings(ckpt, args, given, STAGES[stage].knobs)
    game = args.game
    if ckpt is not None:
        if game is not None and game != ckpt["game"]:
            raise UsageError(f"--resume {args.resume}: the checkpoint is for game {ckpt['game']!r}, not {game!r}")
        game = ckpt["game"]
    game = game or "pong"
    if game not in GAMES:
        raise UsageError(f"unknown game {game!r} (known: {', '.join(GAMES)})")
    params = GAMES[game]
    if ckpt is not None:
        params = Hyperparams(**ckpt["params"])
    if args.env is not None:
        if ckpt is not None:
            resume.check_resume_env(ckpt, args.resume, args.env)
        params = params.replace(env_name=args.env)
    if args.replay_size is not None:
        params = params.replace(replay_size=args.replay_size)
    if args.replay_initial is not None:
        params = params.replace(replay_initial=args.replay_initial)
    if params.replay_initial > params.replay_size:
        raise UsageError(
            f"--replay-initial {params.replay_initial} is larger than the replay size {params.replay_size}"
        )
    device = cli.resolve_device("cuda" if args.cuda else args.device)
    saved_knobs = {}
    for name in STAGES[stage].knobs:  # each knob as the run keeps it on this device
        value = getattr(args, name)
        try:
            setattr(args, name, KNOBS[name].resolve(value, device.type))
        except ValueError as e:
            raise UsageError(str(e)) from None
        saved_knobs[name] = value if KNOBS[name].per_device else getattr(args, name)
    notice = _emulated_bf16(stage, args, given, ckpt, device)
    _check_knobs(stage, args, params)
    if not cli.env_exists(params.env_name):
        raise UsageError(f"env id {params.env_name!r} does not exist")
    env_check.check_env(params.env_name, stage)
    start_frame = int(ckpt["frame_idx"]) if ckpt else 0
    if ckpt is not None and args.save_every is None:
        args.save_every = ckpt.get("save_every")
    if args.max_frames is not None and args.max_frames <= start_frame:
        raise UsageError(f"--max-frames {args.max_frames} is not past the checkpoint's frame {start_frame}")
    replay = _check_replay(stage, args, ckpt, params)
    if STAGES[stage].wrappers == "vector":  # ale-py's vector env: an int32 seed per game
        cli.check_seed(args.seed, start_frame + args.envs - 1, cli.INT32_MAX, "ale-py's vector env")
    if ckpt is None:
        cli.check_writable_dir(args.run_dir, "--run-dir", room=len(game) + 64)  # and the run's folder
    else:
        cli.check_writable_dir(os.path.dirname(os.path.abspath(args.resume)), "--resume")
    return Settings(
        stage,
        args.freeze(),
        frozenset(given),
        game,
        params,
        device,
        start_frame,
        ckpt,
        changed,
        saved_knobs,
        notice,
        replay,
    )


def _emulated_bf16(stage, args, given, ckpt, device) -> str | None:
    """The line a resume prints when it goes on in bf16 from its checkpoint on a device that
    would emulate it (several times slower): a checkpoint saves ``bf16`` where it was given,
    or where a run before ``Knob.per_device`` resolved ``auto`` to it."""
    if ckpt is None or "precision" not in STAGES[stage].knobs or "--precision" in given:
        return None
    if args.precision != "bf16" or precision.native_bf16(device.type):
        return None
    return (
        f"note: the checkpoint's learner is bf16, which {device.type} here emulates (several times "
        "slower); --precision auto computes in fp32 where bf16 is not native"
    )


def _check_replay(stage, args, ckpt, params) -> dict | None:
    """With --save-replay, checkpoints hold the replay ring; a checkpoint that holds one
    is resumed with it (and goes on saving it). Returns the saved ring, read and checked."""
    saved = ckpt.get("replay") if ckpt is not None else None
    args.save_replay = args.save_replay or saved is not None
    if args.save_replay and not args.save_every:
        raise UsageError("--save-replay needs --save-every N (the checkpoints it goes into)")
    if saved is None:
        return None
    return resume.open_ring(args.resume, ckpt, stage, params, args.envs)


def _check_knobs(stage, args, params: Hyperparams) -> None:
    """The stage's own knobs against each other and against this machine's memory."""
    steps, envs = args.steps, args.envs
    batch = params.batch_size * steps
    if batch > params.replay_size:
        raise UsageError(
            f"--steps {steps}: a train batch of {params.batch_size}*{steps} = {batch} transitions is larger "
            f"than the replay size {params.replay_size}"
        )
    if envs > 1 and params.replay_size // envs < 8:
        raise UsageError(f"--envs {envs}: the replay size {params.replay_size} leaves under 8 slots per game")
    memory.check(params.replay_size, envs, STAGES[stage].play != "inline")
