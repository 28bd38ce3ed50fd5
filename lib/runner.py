"""The skeleton every stage shares: command line, validation, device, seeding, run folder,
TensorBoard, checkpoints, and ``main``, the one entry point that turns a stage's outcome into
the RESULT line, summary.json and an exit code.

A stage script is ``train(run)`` (its loop) plus ``main(argv)``, which calls ``runner.main``.
``Run`` raises and returns; it never ends the process, so a whole stage runs in-process too
(the tests do so). ``main`` checks everything (game, env id, numbers, knobs against each other
and against memory, device, run folder, checkpoint) before anything is created: bad input is
one line on stderr and exit 2. Once a run has started, Ctrl-C (130) and SIGTERM (143) stop it
cleanly: child processes are ended, TensorBoard is flushed, and the RESULT line and summary
are written, marked interrupted. A file of the run that cannot be written (disk full, no
permission, folder gone) stops training with one line naming the file and the reason, exit
74; the last good checkpoint and model stay as they were and no ``.tmp`` file is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import glob
import importlib
import json
import os
import random
import signal
import sys
import threading
import time
import traceback

import gymnasium as gym
import numpy as np
import torch

from lib import cli, compat, wrappers
from lib.cli import EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM, EXIT_WRITE, UsageError
from lib.params import GAMES, Hyperparams
from lib.stages import KNOBS, STAGES
from lib.tracking import RewardTracker, SpeedMeter, epsilon_at, sync_due

CHECKPOINT_KIND = "dqn-speedup-checkpoint"
MODEL_KIND = "dqn-speedup-model"
# Memory a game of the native vector env takes (emulator, screen and stack buffers, its share
# of the Queue), rounded up: used only to refuse an --envs that cannot fit.
ENV_BYTES = 32 * 2**20
FRAME_BYTES = 84 * 84  # a replay slot's frame; the rest of the slot is 14 bytes


class RunError(Exception):
    """A run that cannot go on (a dead play process, ...): one line, exit code 1."""


class WriteError(RunError):
    """A file of the run could not be written: one line naming it and why, exit code 74."""


class Terminated(BaseException):
    """Raised in the main process by SIGTERM, like KeyboardInterrupt for SIGINT."""


def flush_denormals() -> None:
    """Treat subnormal floats as zero on this CPU (x86 FTZ/DAZ; threads started later inherit it).

    Late in a run, dead ReLU units leave Adam moments and gradients that decay into the
    subnormal range, and each such value sends an x86 CPU down a slow microcode path (see the
    README's deviations). Values below 1.2e-38 carry nothing for learning. No effect on GPU kernels.
    """
    torch.set_flush_denormal(True)


# glibc's malloc, as every stage process sets it (``keep_freed_memory``): blocks up to 32 MiB
# (glibc's largest mmap threshold on 64-bit) come from the heap, and up to 1 GiB of free heap
# stays mapped instead of going back to the kernel.
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**30
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MALLOC_DEFAULTS_ENV = "DQN_MALLOC_DEFAULTS"  # set to 1: leave glibc's malloc as it is


def is_glibc() -> bool:
    """Whether this process runs on GNU libc (whose malloc ``mallopt`` tunes)."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


def malloc_left_alone() -> str | None:
    """Why ``keep_freed_memory`` leaves glibc's malloc as it is here (one line), or None."""
    if os.environ.get(MALLOC_DEFAULTS_ENV, "") not in ("", "0"):
        return f"glibc defaults ({MALLOC_DEFAULTS_ENV}=1)"
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    for name in ("trim_threshold", "mmap_threshold"):
        if f"MALLOC_{name.upper()}_" in os.environ or f"glibc.malloc.{name}=" in tunables:
            return f"as the environment sets it ({name})"
    if not is_glibc():
        return "the C library's defaults (not glibc)"
    return None


def malloc_setting() -> str:
    """What the stage processes started from here do with malloc, for reports."""
    return malloc_left_alone() or (
        f"glibc malloc keeps freed memory (mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
        f"trim threshold {TRIM_THRESHOLD >> 20} MiB)"
    )


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep the memory a train step frees, for the next step to reuse.

    A train step allocates and frees the same few tens of MB every time (the batch in each
    dtype and layout, activations, gradients). By default glibc serves blocks above a moving
    threshold (128 KiB at first) with fresh ``mmap`` and hands freed heap above another back
    to the kernel, so every step maps new pages and the kernel zeroes each 4 KiB page on its
    first touch. On a 2-core CPU that was about 1,500 page faults per train step in stage 07
    and 4,400 in stage 08 (the same step, but another sequence of allocations: 08 reuses its
    batch buffers, and where glibc's thresholds settle depends on that sequence), and 08 ran
    at about 0.92x of 07. With both thresholds fixed high, a step's memory stays mapped and is
    reused (under 60 faults a step in either) and 08 runs as fast as 07 (1.00 over 16 runs
    each; ``results/cpu-amd-epyc-2c-malloc``). Nothing changes in what is computed.

    Returns whether the settings took effect; ``malloc_left_alone`` says why not: not glibc,
    ``DQN_MALLOC_DEFAULTS=1`` (glibc's defaults, e.g. to measure the difference), or either
    threshold already set by the user (``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``
    or ``GLIBC_TUNABLES``): theirs stand.
    """
    if malloc_left_alone() is not None:
        return False
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        return libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    except (OSError, AttributeError):
        return False


def process_settings() -> None:
    """What every process of a stage (trainer, play process) and the bench's part timings
    set first: the subnormal flush and the malloc thresholds."""
    flush_denormals()
    keep_freed_memory()


def make_parser(stage: str, description: str | None) -> cli.Parser:
    """The command-line contract every stage keeps, and the stage's own knobs (the registry's).
    A knob the stage does not have is no flag, and its value is the knob's ``unset``."""
    p = cli.Parser(description=(description or "").split("\n\n")[0], prog=STAGES[stage].script)
    cli.add_device(p)
    p.add_argument("--cuda", action="store_true", help="shorthand for --device cuda")
    p.add_argument("--game", default=None, help=f"hyperparameter set: {', '.join(GAMES)} (default pong)")
    p.add_argument("--env", default=None, help="gymnasium env id to use instead of the game's")
    p.add_argument("--seed", type=cli.count, default=0, help="seeds python, numpy, torch and the env")
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


def env_exists(env_id: str) -> bool:
    """True if gymnasium knows ``env_id``; "module:Name-v0" imports module first, as make does."""
    try:
        if ":" in env_id:
            module, env_id = env_id.split(":", 1)
            importlib.import_module(module)
        gym.spec(env_id)
        return True
    except Exception:
        return False


def available_memory() -> int | None:
    """Bytes this machine can still hand out (MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def load_checkpoint(path: str) -> dict:
    if not os.path.isfile(path):
        raise UsageError(f"--resume {path}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"--resume {path}: not a readable checkpoint ({type(e).__name__})")
    if not isinstance(ckpt, dict) or ckpt.get("kind") != CHECKPOINT_KIND:
        raise UsageError(f"--resume {path}: not a dqn-speedup checkpoint")
    compat.check_checkpoint(ckpt, path)
    return ckpt


# How an optimizer runs, not what it has learned: a resumed run keeps its own choice.
OPTIMIZER_IMPL = ("foreach", "fused", "capturable", "differentiable")


def load_state(obj, state: dict) -> None:
    """``obj.load_state_dict(state)``; for an optimizer, the implementation flags (fused,
    foreach, ...) stay the ones this stage built it with. torch's load_state_dict copies them
    from the checkpoint, so that stage 05 resuming stage 07's checkpoint would otherwise run
    07's fused Adam, and a CUDA-made checkpoint could ask a CPU build for a kernel it lacks."""
    if not isinstance(obj, torch.optim.Optimizer):
        obj.load_state_dict(state)
        return
    groups = []
    for saved, group in zip(state["param_groups"], obj.param_groups):
        saved = {k: v for k, v in saved.items() if k not in OPTIMIZER_IMPL}
        saved.update({k: group[k] for k in OPTIMIZER_IMPL if k in group})
        groups.append(saved)
    # Before loading, so that torch places each 'step' counter where this implementation wants it.
    obj.load_state_dict({**state, "param_groups": groups})


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (CUDA included). Envs take ``seed`` at their first reset."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """The global RNG states of python, numpy and torch (and CUDA once used), as saved data."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), np_state[2], np_state[3], np_state[4]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


_open = open  # the one way files of a run are opened for writing (tests put a failing disk here)


def atomic_write(path: str, write) -> None:
    """``write(f)`` into ``path.tmp`` (a binary file), then rename it to ``path``: a crash or a
    full disk never leaves a broken file under the real name. On failure the ``.tmp`` file is
    removed and WriteError names the file and the reason."""
    tmp = path + ".tmp"
    try:
        with _open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as RuntimeError
        reason = compat.write_reason(e, tmp)
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise WriteError(f"cannot write {path}: {reason}") from None


class EventWriter:
    """TensorBoard's SummaryWriter whose failures (raised by its writer thread at the next call)
    become WriteError naming the event file. The writer thread's own report of the failure
    (a traceback on stderr) is held back: the run reports it in one line."""

    @staticmethod
    def quiet_writer_threads(previous):
        def hook(args):
            if type(args.thread).__name__ != "_AsyncWriterThread":
                previous(args)

        return hook

    def __init__(self, folder: str, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.folder = folder
        try:
            self._writer = SummaryWriter(folder, purge_step=purge_step)
        except (OSError, RuntimeError) as e:
            raise WriteError(f"cannot write TensorBoard events in {folder}: {getattr(e, 'strerror', None) or e}")

    def _fail(self, e: Exception):
        path = getattr(self._writer.file_writer.event_writer, "_file_name", self.folder)
        raise WriteError(f"cannot write {path}: {getattr(e, 'strerror', None) or e}") from None

    def add_scalar(self, tag: str, value, step: int) -> None:
        try:
            self._writer.add_scalar(tag, value, step)
        except Exception as e:
            self._fail(e)

    def flush(self) -> None:
        try:
            self._writer.flush()
        except Exception as e:
            self._fail(e)

    def close(self) -> None:
        try:
            self._writer.close()
        except Exception as e:
            self._fail(e)


class Run:
    """One training run: validated settings, then (``start``) its folder, writer and tracker.

    ``Run(stage, args)`` only checks (UsageError); ``start()`` creates; ``close()`` ends child
    processes, takes the last checkpoint and writes the summary. ``frames(step)`` yields the
    agent-step counter and, between iterations, prints PROGRESS lines and takes checkpoints;
    ``game_over`` reports a finished game, keeps the best model and says whether it is solved.
    """

    def __init__(self, stage: str, args, argv=None):
        self.stage = stage
        self.args = args
        self.given = {a.split("=", 1)[0] for a in (sys.argv[1:] if argv is None else argv) if a.startswith("--")}
        self.wrappers = STAGES[stage].wrappers
        self.prog = STAGES[stage].script
        self.children: list = []
        self.saveables: dict = {}
        self.solved_flag = False
        self.folder = None
        self.buffer = None
        self.env = None
        self.writer = None
        self.tracker = None
        self._validate()
        self.frame_idx = self.start_frame
        self._last_save = self.start_frame
        self._best_due = False  # a new best that best.pt does not hold yet
        self._best_saved = -float("inf")  # time.monotonic() of the last best.pt
        self.speed = SpeedMeter()

    # -- validation: nothing is created here --------------------------------------------
    def _validate(self) -> None:
        args = self.args
        self.ckpt = load_checkpoint(args.resume) if args.resume else None
        if self.ckpt is not None:  # the stage's knobs go on as saved unless given again
            for knob, value in self.ckpt.get("knobs", {}).items():
                if knob in STAGES[self.stage].knobs and f"--{knob}" not in self.given:
                    setattr(args, knob, value)
        game = args.game
        if self.ckpt is not None:
            if game is not None and game != self.ckpt["game"]:
                raise UsageError(
                    f"--resume {args.resume}: the checkpoint is for game {self.ckpt['game']!r}, not {game!r}"
                )
            game = self.ckpt["game"]
        game = game or "pong"
        if game not in GAMES:
            raise UsageError(f"unknown game {game!r} (known: {', '.join(GAMES)})")
        self.game = game
        params = GAMES[game]
        if self.ckpt is not None:
            params = Hyperparams(**self.ckpt["params"])
        if args.env is not None:
            if self.ckpt is not None:
                compat.check_resume_env(self.ckpt, args.resume, args.env)
            params = params.replace(env_name=args.env)
        if args.replay_size is not None:
            params = params.replace(replay_size=args.replay_size)
        if args.replay_initial is not None:
            params = params.replace(replay_initial=args.replay_initial)
        if params.replay_initial > params.replay_size:
            raise UsageError(
                f"--replay-initial {params.replay_initial} is larger than the replay size {params.replay_size}"
            )
        self.device = cli.resolve_device("cuda" if args.cuda else args.device)
        for name in STAGES[self.stage].knobs:  # each knob as the run keeps it on this device
            try:
                setattr(args, name, KNOBS[name].resolve(getattr(args, name), self.device.type))
            except ValueError as e:
                raise UsageError(str(e)) from None
        self._check_knobs(params)
        if not env_exists(params.env_name):
            raise UsageError(f"env id {params.env_name!r} does not exist")
        compat.check_env(params.env_name, self.stage)
        self.params = params
        self.start_frame = int(self.ckpt["frame_idx"]) if self.ckpt else 0
        if self.ckpt is not None and args.save_every is None:
            args.save_every = self.ckpt.get("save_every")
        if args.max_frames is not None and args.max_frames <= self.start_frame:
            raise UsageError(f"--max-frames {args.max_frames} is not past the checkpoint's frame {self.start_frame}")
        self.replay = self._check_replay()
        if self.ckpt is None:
            cli.check_writable_dir(args.run_dir, "--run-dir")
        else:
            cli.check_writable_dir(os.path.dirname(os.path.abspath(args.resume)), "--resume")

    def _check_replay(self) -> dict | None:
        """With --save-replay, checkpoints hold the replay ring; a checkpoint that holds one
        is resumed with it (and goes on saving it). Returns the saved ring, read and checked."""
        args, ckpt = self.args, self.ckpt
        saved = ckpt.get("replay") if ckpt is not None else None
        args.save_replay = args.save_replay or saved is not None
        if args.save_replay and not args.save_every:
            raise UsageError("--save-replay needs --save-every N (the checkpoints it goes into)")
        if saved is None:
            return None
        return compat.open_ring(args.resume, ckpt, self.stage, self.params, args.envs)

    def _check_knobs(self, params: Hyperparams) -> None:
        """The stage's own knobs against each other and against this machine's memory."""
        steps, envs = self.args.steps, self.args.envs
        batch = params.batch_size * steps
        if batch > params.replay_size:
            raise UsageError(
                f"--steps {steps}: a train batch of {params.batch_size}*{steps} = {batch} transitions is larger "
                f"than the replay size {params.replay_size}"
            )
        if envs > 1 and params.replay_size // envs < 8:
            raise UsageError(f"--envs {envs}: the replay size {params.replay_size} leaves under 8 slots per game")
        need = params.replay_size * (FRAME_BYTES + 14) + envs * ENV_BYTES
        free = available_memory()
        if free is not None and need > free:
            raise UsageError(
                f"the replay ring of {params.replay_size} slots and {envs} game(s) need about {need / 2**30:.1f} GiB; "
                f"this machine has {free / 2**30:.1f} GiB available"
            )

    # -- start: the run folder, writer, tracker, seeds -------------------------------------
    def start(self) -> None:
        process_settings()
        self._started = time.perf_counter()
        self.commit = cli.git_commit()  # the code this run started with
        if self.ckpt is not None:
            self.folder = os.path.dirname(os.path.abspath(self.args.resume))
        else:
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            base = os.path.join(self.args.run_dir, f"{self.stage}-{self.game}-seed{self.args.seed}-{stamp}")
            self.folder, n = base, 1
            while os.path.exists(self.folder):
                n += 1
                self.folder = f"{base}-{n}"
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as e:
            raise WriteError(f"cannot create {self.folder}: {e.strerror or e}") from None
        # A resumed run drops the events logged after its checkpoint; those of the checkpoint's
        # own frame were logged before it was taken.
        self.writer = EventWriter(self.folder, purge_step=self.start_frame + 1 if self.ckpt else None)
        rewards = self.ckpt["rewards"] if self.ckpt else None
        log = (lambda _line: None) if self.args.quiet else (lambda line: print(line, flush=True))
        self.tracker = RewardTracker(self.writer, self.params.stop_reward, rewards=rewards, log=log)
        if self.ckpt is not None:
            self.tracker.best_mean = self.ckpt.get("best_mean")
        set_seed(self.args.seed)  # before the nets are built, so that their initial weights repeat

    # -- objects that checkpoints hold ----------------------------------------------------
    @property
    def env_seed(self) -> int:
        """The seed for the env's first reset (shifted on resume so games do not repeat)."""
        return self.args.seed + self.start_frame

    def attach(self, buffer=None, **objects) -> None:
        """Register net, tgt_net and optimizer (every checkpoint holds them) and the replay
        buffer (checkpoints hold it with --save-replay); on resume, load their saved state."""
        self.saveables.update(objects)
        self.buffer = buffer
        if self.ckpt is None:
            return
        for name, obj in objects.items():
            load_state(obj, self.ckpt[name])
        set_rng_state(self.ckpt["rng"])
        self.tracker.load_state_dict(self.ckpt["tracker"])
        if self.replay is not None:
            converted = compat.load_ring(buffer, self.replay, self.stage, self.ckpt)
            self.replay = None  # the file's mapping goes; the buffer holds the ring
            how = f"with its replay buffer of {len(buffer)} transitions{converted}"
        else:
            how = f"the replay buffer is refilled with {self.params.replay_initial} transitions before training goes on"
        print(f"resuming {self.ckpt['stage']} {self.game} at frame {self.start_frame}: {how}", flush=True)

    def start_env(self, env):
        """Seed and reset ``env`` for the run's first game, or, resuming a checkpoint that holds
        the game in progress (--save-replay), put it back; returns the current observation."""
        self.env = env
        if self.ckpt is not None and "env" in self.ckpt:
            return wrappers.restore_env(env, self.ckpt["env"])
        env.action_space.seed(self.env_seed)
        state, _ = env.reset(seed=self.env_seed)
        return state

    def run_seconds(self) -> float | None:
        """Seconds the run has taken to reach ``frame_idx`` over all its sittings: those its
        checkpoint had taken plus this sitting's (the frames an interrupted sitting played past
        its last checkpoint are played again, and counted once). None when resumed from a
        checkpoint that does not say."""
        before = self.ckpt.get("run_seconds") if self.ckpt is not None else 0.0
        return None if before is None else before + time.perf_counter() - self._started

    def save_checkpoint(self) -> str:
        self.tracker.flush_loss()  # the events up to the checkpoint's frame are all written
        state = {
            "kind": CHECKPOINT_KIND,
            "stage": self.stage,
            "game": self.game,
            "wrappers": self.wrappers,
            "params": dataclasses.asdict(self.params),
            "frame_idx": self.frame_idx,
            "run_seconds": self.run_seconds(),
            "save_every": self.args.save_every,
            "epsilon": epsilon_at(self.frame_idx, self.params),
            "rewards": list(self.tracker.rewards),
            "best_mean": self.tracker.best_mean,
            "rng": rng_state(),
            "tracker": self.tracker.state_dict(),
            "knobs": {knob: getattr(self.args, knob) for knob in STAGES[self.stage].knobs},
            "belongs": compat.belongs(self.stage, self.game, self.params, self.args.envs),
        }
        for name, obj in self.saveables.items():
            state[name] = obj.state_dict()
        old_replays = glob.glob(os.path.join(self.folder, "replay-*.pt"))
        path = os.path.join(self.folder, "checkpoint.pt")
        if self.args.save_replay and self.buffer is not None:
            # The ring goes in a file of its own, named by frame and written first: a crash
            # between the two writes leaves the previous pair whole.
            name = f"replay-{self.frame_idx}.pt"
            info = compat.ring_belongs(self.stage, self.game, self.params, self.args.envs, self.frame_idx)
            try:
                atomic_write(os.path.join(self.folder, name), lambda f: compat.save_ring(self.buffer, info, f))
            except WriteError:
                if not os.path.exists(path):  # the first save: a checkpoint without its ring still resumes
                    with contextlib.suppress(WriteError):
                        atomic_write(path, lambda f: torch.save(state, f))
                raise
            state["replay"] = {"file": name, **info}
            if self.env is not None:
                state["env"] = wrappers.env_state(self.env)
        atomic_write(path, lambda f: torch.save(state, f))
        for old in old_replays:
            if os.path.basename(old) != state.get("replay", {}).get("file"):
                os.remove(old)
        self._last_save = self.frame_idx
        return path

    def save_model(self, name: str) -> str:
        net = self.saveables["net"]
        state = {k: v.detach().float().cpu() if v.is_floating_point() else v.cpu() for k, v in net.state_dict().items()}
        payload = {
            "kind": MODEL_KIND,
            "stage": self.stage,
            "game": self.game,
            "env_name": self.params.env_name,
            "wrappers": self.wrappers,
            "frame_idx": self.frame_idx,
            "mean_reward": self.tracker.mean_reward,
            "net": state,
        }
        path = os.path.join(self.folder, name)
        atomic_write(path, lambda f: torch.save(payload, f))
        return path

    # -- the loop --------------------------------------------------------------------------
    def frames(self, step: int = 1):
        """Yield the agent-step counter in increments of ``step`` until --max-frames.

        Code after ``yield`` runs once the loop body of that frame is complete, so the
        checkpoint taken there is consistent."""
        frame_idx = self.frame_idx
        limit = self.args.max_frames
        every = self.args.progress
        next_report = time.perf_counter() + (every or 0.0)
        while limit is None or frame_idx < limit:
            frame_idx += step
            yield frame_idx
            self.frame_idx = frame_idx
            if every and time.perf_counter() >= next_report:
                next_report += every
                phase = "train" if self.speed.started else "fill"
                fps = self.speed.fps(frame_idx)
                print(f"PROGRESS stage={self.stage} frame={frame_idx} phase={phase} fps={fps:.1f}", flush=True)
            if self.args.save_every and sync_due(self._last_save, frame_idx, self.args.save_every):
                self.save_checkpoint()

    def game_over(self, reward: float, frame_idx: int, epsilon: float) -> bool:
        """Report a finished game; keep the best model (``best.pt``: at most every BEST_SECONDS,
        the newest best at the run's end); True (and the model saved) when solved."""
        self.frame_idx = frame_idx
        solved = self.tracker.reward(reward, frame_idx, epsilon)
        if self.tracker.new_best() and "net" in self.saveables:
            self._best_due = True
        if self._best_due and time.monotonic() - self._best_saved >= self.BEST_SECONDS:
            self.save_best()
        if solved:
            self.solved_flag = True
            if "net" in self.saveables:
                self.save_model("model.pt")
            print(f"Solved in {frame_idx} frames!", flush=True)
        return solved

    BEST_SECONDS = 60.0  # at most one best.pt a minute: writing it reads the net back from the device

    def save_best(self) -> None:
        """Write the newest best model to ``best.pt``, if one is waiting."""
        if self._best_due:
            self._best_due = False
            self._best_saved = time.monotonic()
            self.save_model("best.pt")

    # -- the end ---------------------------------------------------------------------------
    def stop_children(self) -> None:
        for proc in self.children:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + 3.0
        for proc in self.children:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)

    def close(self, interrupted: str | None = None, error: str | None = None) -> tuple[dict, str | None]:
        """End the children, take the last checkpoint (unless the run failed), flush TensorBoard
        and write the summary and the RESULT line. Returns (summary, the first write failure)."""
        self.stop_children()
        failed = None
        try:
            self.save_best()  # the newest best is never lost at the end
        except WriteError as e:
            failed = str(e)
        if self.args.save_every and error is None and self.saveables and self.frame_idx > self._last_save:
            try:
                self.save_checkpoint()  # the end of a run, or the last complete frame before a signal
            except WriteError as e:
                failed = failed or str(e)
        try:
            self.tracker.flush_loss()
            self.writer.close()
        except WriteError as e:
            failed = failed or str(e)
        error = error or failed
        summary = self._summary(interrupted, error)
        try:
            data = json.dumps(summary, indent=2).encode()
            atomic_write(os.path.join(self.folder, "summary.json"), lambda f: f.write(data))
        except WriteError as e:
            failed = failed or str(e)
        mean = self.tracker.mean_reward
        line = (
            f"RESULT stage={self.stage} game={self.game} frames={self.frame_idx} seconds={summary['seconds']:.1f} "
            f"fps={summary['fps']:.1f} solved={'yes' if self.solved_flag else 'no'} mean_reward={mean:.3f}"
        )
        if interrupted:
            line += f" interrupted={interrupted}"
        if error or failed:
            line += " error=yes"
        print(line, flush=True)
        return summary, failed

    def _summary(self, interrupted: str | None, error: str | None) -> dict:
        mean = self.tracker.mean_reward
        total = self.run_seconds()
        return {
            "stage": self.stage,
            "game": self.game,
            "env": self.params.env_name,
            "seed": self.args.seed,
            "device": str(self.device),
            "frames": self.frame_idx,
            "start_frame": self.start_frame,
            "train_frames": self.speed.frames(self.frame_idx),
            "seconds": round(time.perf_counter() - self._started, 3),
            "run_seconds": None if total is None else round(total, 3),
            "fps": round(self.speed.fps(self.frame_idx), 2),
            "solved": self.solved_flag,
            "mean_reward": None if np.isnan(mean) else round(mean, 3),
            "games": len(self.tracker.rewards),
            "interrupted": interrupted,
            "error": error,
            "params": dataclasses.asdict(self.params),
            "argv": sys.argv,
            "commit": self.commit,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
        }


@dataclasses.dataclass
class Outcome:
    """What ``main`` returns: the exit code, the summary written (None for bad input), the run."""

    code: int
    summary: dict | None = None
    run: Run | None = None


def _raise_terminated(signum, frame):
    raise Terminated()


def main(stage: str, parser: cli.Parser, train, argv=None) -> Outcome:
    """Parse, validate, run ``train(run)`` and close the run; every outcome becomes an exit code.

    Signal handlers and torch's thread count are restored on return, so that stages can run
    one after another in one process."""
    try:
        args = parser.parse_args(argv)
        run = Run(stage, args, argv)
    except UsageError as e:
        return Outcome(cli.usage_exit(parser.prog, e))
    threads = torch.get_num_threads()
    old_thread_hook = threading.excepthook
    threading.excepthook = EventWriter.quiet_writer_threads(old_thread_hook)
    old_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, _raise_terminated)
    # Ctrl-C stops the run even where the shell started it with SIGINT ignored (a background
    # job of a non-interactive shell): Python then never raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code, interrupted, error = 0, None, None
    try:
        try:
            run.start()
            train(run)
        except KeyboardInterrupt:
            code, interrupted = EXIT_SIGINT, "SIGINT"
        except Terminated:
            code, interrupted = EXIT_SIGTERM, "SIGTERM"
        except RunError as e:
            code, error = (EXIT_WRITE if isinstance(e, WriteError) else EXIT_FAILED), str(e)
            print(f"{parser.prog}: error: {e}", file=sys.stderr, flush=True)
        except Exception as e:
            code, error = EXIT_FAILED, f"{type(e).__name__}: {e}"
            traceback.print_exc()
        # Further signals must not cut the wrap-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if run.tracker is None:  # start() could not create the folder or writer: nothing to close
            run.stop_children()
            return Outcome(code, None, run)
        summary, failed = run.close(interrupted, error)
        if failed and error is None:  # one line for the first failure; what follows from it is not news
            print(f"{parser.prog}: error: {failed}", file=sys.stderr, flush=True)
        if failed and code in (0, EXIT_SIGINT, EXIT_SIGTERM):
            code = EXIT_WRITE
        sys.stdout.flush()
        return Outcome(code, summary, run)
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        threading.excepthook = old_thread_hook
        torch.set_num_threads(threads)


def exit_with(outcome: Outcome) -> None:
    """A script's last word: its exit code."""
    sys.exit(outcome.code)
