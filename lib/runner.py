"""The skeleton every stage shares: command line, validation, device, seeding, run folder,
TensorBoard, signals, checkpoints, and the RESULT line.

Order matters for bad input: everything is checked (game, env id, numbers, device, run
folder, checkpoint) before anything is created, and a bad value ends the program with one
line on stderr and exit code 2. Once a run has started, Ctrl-C (exit 130) and SIGTERM
(exit 143) stop it cleanly: child processes are ended, TensorBoard is flushed, and the
RESULT line and summary.json are written, marked interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import signal
import sys
import time
import traceback

import numpy as np
import torch

from lib.params import GAMES, Hyperparams
from lib.tracking import RewardTracker, SpeedMeter, sync_due

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


def flush_denormals() -> None:
    """Treat subnormal floats as zero on this CPU (x86 FTZ/DAZ; threads started later inherit it).

    Past ~100k Pong frames, dead ReLU units leave Adam moments and gradients that decay into the
    subnormal range (half of fc1's exp_avg in a 224k-frame checkpoint), and each such value
    costs the CPU a slow microcode path: the optimizer step went from 0.9 ms to 7 ms. Values
    below 1.2e-38 carry nothing for learning. No effect on GPU kernels.
    """
    torch.set_flush_denormal(True)


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


class RunError(Exception):
    """A run that cannot go on (a dead play process, ...): one line, exit code 1."""


class Terminated(BaseException):
    """Raised in the main process by SIGTERM, like KeyboardInterrupt for SIGINT."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def fail_usage(prog: str, message: str):
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}")
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {n}")
    return n


def _positive(value: str) -> int:
    n = _count(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {n}")
    return n


def make_parser(stage: str, description: str | None) -> argparse.ArgumentParser:
    """The command-line contract every stage keeps. Stages add only their own knob."""
    p = _Parser(description=(description or "").split("\n\n")[0], prog=os.path.basename(sys.argv[0]))
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when available")
    p.add_argument("--cuda", action="store_true", help="shorthand for --device cuda")
    p.add_argument("--game", default=None, help=f"hyperparameter set: {', '.join(GAMES)} (default pong)")
    p.add_argument("--env", default=None, help="gymnasium env id to use instead of the game's")
    p.add_argument("--seed", type=_count, default=0, help="seeds python, numpy, torch and the env")
    p.add_argument("--max-frames", type=_positive, default=None, help="stop after N agent steps")
    p.add_argument("--replay-initial", type=_positive, default=None, help="transitions before training")
    p.add_argument("--replay-size", type=_positive, default=None, help="replay buffer capacity")
    p.add_argument("--run-dir", default="runs", help="TensorBoard root; one sub-folder per run")
    p.add_argument("--save-every", type=_positive, default=None, help="checkpoint every N agent steps")
    p.add_argument("--resume", default=None, metavar="PATH", help="continue from a checkpoint")
    p.add_argument("--quiet", action="store_true", help="no per-game lines")
    p.add_argument("--progress", type=float, default=0.0, metavar="SEC", help="a PROGRESS line every SEC seconds")
    return p


def parse_args(stage: str, description: str | None, parser: argparse.ArgumentParser | None = None, argv=None):
    parser = parser or make_parser(stage, description)
    try:
        return parser.parse_args(argv)
    except UsageError as e:
        fail_usage(parser.prog, str(e))


def env_exists(env_id: str) -> bool:
    """True if gymnasium knows ``env_id``; "module:Name-v0" imports module first, as make does."""
    import importlib

    import gymnasium as gym

    import lib.wrappers  # noqa: F401  (registers the ALE envs)

    try:
        if ":" in env_id:
            module, env_id = env_id.split(":", 1)
            importlib.import_module(module)
        gym.spec(env_id)
        return True
    except Exception:
        return False


def resolve_device(args) -> torch.device:
    name = "cuda" if args.cuda else args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available (use --device cpu)")
    return torch.device(name)


def check_writable_dir(path: str, flag: str = "--run-dir") -> None:
    """UsageError unless ``path`` is, or could be made as, a folder this user can write."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {probe} is not a writable folder")


def load_checkpoint(path: str) -> dict:
    if not os.path.isfile(path):
        raise UsageError(f"--resume {path}: no such file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"--resume {path}: not a readable checkpoint ({type(e).__name__})")
    if not isinstance(ckpt, dict) or ckpt.get("kind") != "dqn-speedup-checkpoint":
        raise UsageError(f"--resume {path}: not a dqn-speedup checkpoint")
    return ckpt


# How an optimizer runs, not what it has learned: a resumed run keeps its own choice.
_OPTIMIZER_IMPL = ("foreach", "fused", "capturable", "differentiable")


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
        saved = {k: v for k, v in saved.items() if k not in _OPTIMIZER_IMPL}
        saved.update({k: group[k] for k in _OPTIMIZER_IMPL if k in group})
        groups.append(saved)
    # Before loading, so that torch places each 'step' counter where this implementation wants it.
    obj.load_state_dict({**state, "param_groups": groups})


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (CUDA included). Envs take ``seed`` at their first reset."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _rng_state() -> dict:
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), np_state[2], np_state[3], np_state[4]],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _commit() -> str:
    try:
        import subprocess

        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        out = subprocess.run(
            ["git", "-C", here, "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


class Run:
    """One training run: validated settings, its folder, writer, tracker and exit handling.

    Use as ``with run:`` around everything after construction; ``run.frames(step)`` yields
    the agent-step counter and takes checkpoints between iterations.
    """

    def __init__(self, stage: str, args, wrappers: str = "old"):
        self.stage = stage
        self.args = args
        self.wrappers = wrappers
        self.prog = os.path.basename(sys.argv[0])
        flush_denormals()
        try:
            self._validate()
        except UsageError as e:
            fail_usage(self.prog, str(e))
        self.frame_idx = self.start_frame
        self.speed = SpeedMeter()
        self.solved_flag = False
        self.children: list = []
        self._saveables: dict = {}
        self._started = time.perf_counter()
        self.commit = _commit()  # the code this run started with
        self._last_save = self.start_frame
        self._make_folder()
        set_seed(args.seed)  # before the nets are built, so that their initial weights repeat

    # -- validation: nothing is created here --------------------------------------------
    def _validate(self) -> None:
        args = self.args
        self.ckpt = load_checkpoint(args.resume) if args.resume else None
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
            params = params.replace(env_name=args.env)
        if args.replay_size is not None:
            params = params.replace(replay_size=args.replay_size)
        if args.replay_initial is not None:
            params = params.replace(replay_initial=args.replay_initial)
        if params.replay_initial > params.replay_size:
            raise UsageError(
                f"--replay-initial {params.replay_initial} is larger than the replay size {params.replay_size}"
            )
        if not env_exists(params.env_name):
            raise UsageError(f"env id {params.env_name!r} does not exist")
        steps = getattr(args, "steps", 1)
        if steps < 1:
            raise UsageError("--steps must be at least 1")
        self.params = params
        self.device = resolve_device(args)
        self.start_frame = int(self.ckpt["frame_idx"]) if self.ckpt else 0
        if self.ckpt is not None and args.save_every is None:
            args.save_every = self.ckpt.get("save_every")
        if args.max_frames is not None and args.max_frames <= self.start_frame:
            raise UsageError(f"--max-frames {args.max_frames} is not past the checkpoint's frame {self.start_frame}")
        if self.ckpt is None:
            check_writable_dir(args.run_dir)
        else:
            check_writable_dir(os.path.dirname(os.path.abspath(args.resume)))

    def _make_folder(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if self.ckpt is not None:
            self.folder = os.path.dirname(os.path.abspath(self.args.resume))
        else:
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            base = os.path.join(self.args.run_dir, f"{self.stage}-{self.game}-seed{self.args.seed}-{stamp}")
            self.folder, n = base, 1
            while os.path.exists(self.folder):
                n += 1
                self.folder = f"{base}-{n}"
        os.makedirs(self.folder, exist_ok=True)
        self.writer = SummaryWriter(self.folder, purge_step=self.start_frame if self.ckpt else None)
        rewards = self.ckpt["rewards"] if self.ckpt else None
        log = (lambda _line: None) if self.args.quiet else (lambda line: print(line, flush=True))
        self.tracker = RewardTracker(self.writer, self.params.stop_reward, rewards=rewards, log=log)
        if self.ckpt is not None:
            self.tracker.best_mean = self.ckpt.get("best_mean")

    # -- objects that checkpoints hold ----------------------------------------------------
    @property
    def env_seed(self) -> int:
        """The seed for the env's first reset (shifted on resume so games do not repeat)."""
        return self.args.seed + self.start_frame

    def attach(self, **objects) -> None:
        """Register net, tgt_net and optimizer; on resume, load their saved state."""
        self._saveables.update(objects)
        if self.ckpt is None:
            return
        for name, obj in objects.items():
            load_state(obj, self.ckpt[name])
        _set_rng_state(self.ckpt["rng"])
        print(
            f"resuming {self.ckpt['stage']} {self.game} at frame {self.start_frame}: the replay buffer is "
            f"refilled with {self.params.replay_initial} transitions before training goes on",
            flush=True,
        )

    def save_checkpoint(self) -> str:
        from lib.tracking import epsilon_at

        state = {
            "kind": "dqn-speedup-checkpoint",
            "stage": self.stage,
            "game": self.game,
            "wrappers": self.wrappers,
            "params": dataclasses.asdict(self.params),
            "frame_idx": self.frame_idx,
            "save_every": self.args.save_every,
            "epsilon": epsilon_at(self.frame_idx, self.params),
            "rewards": list(self.tracker.rewards),
            "best_mean": self.tracker.best_mean,
            "rng": _rng_state(),
        }
        for name, obj in self._saveables.items():
            state[name] = obj.state_dict()
        path = os.path.join(self.folder, "checkpoint.pt")
        tmp = path + ".tmp"
        torch.save(state, tmp)
        os.replace(tmp, path)  # atomic: a crash never leaves a broken latest checkpoint
        return path

    def save_model(self, name: str) -> str:
        net = self._saveables["net"]
        path = os.path.join(self.folder, name)
        tmp = path + ".tmp"
        state = {k: v.detach().float().cpu() if v.is_floating_point() else v.cpu() for k, v in net.state_dict().items()}
        payload = {
            "kind": "dqn-speedup-model",
            "stage": self.stage,
            "game": self.game,
            "env_name": self.params.env_name,
            "wrappers": self.wrappers,
            "frame_idx": self.frame_idx,
            "mean_reward": self.tracker.mean_reward,
            "net": state,
        }
        torch.save(payload, tmp)
        os.replace(tmp, path)
        return path

    # -- the loop --------------------------------------------------------------------------
    def frames(self, step: int = 1):
        """Yield the agent-step counter in increments of ``step`` until --max-frames.

        Code after ``yield`` runs once the loop body of that frame is complete, so the
        checkpoint taken there is consistent."""
        frame_idx = self.frame_idx
        limit = self.args.max_frames
        every = self.args.progress
        next_report = time.perf_counter() + every
        while limit is None or frame_idx < limit:
            frame_idx += step
            yield frame_idx
            self.frame_idx = frame_idx
            if every and time.perf_counter() >= next_report:
                next_report += every
                phase = "train" if self.speed.started else "fill"
                print(f"PROGRESS stage={self.stage} frame={frame_idx} phase={phase} fps={self.speed.fps(frame_idx):.1f}", flush=True)
            if self.args.save_every and sync_due(self._last_save, frame_idx, self.args.save_every):
                self.save_checkpoint()
                self._last_save = frame_idx

    def game_over(self, reward: float, frame_idx: int, epsilon: float) -> bool:
        """Report a finished game; keep the best model; True (and the model saved) when solved."""
        self.frame_idx = frame_idx
        solved = self.tracker.reward(reward, frame_idx, epsilon)
        if self.tracker.new_best() and "net" in self._saveables:
            self.save_model("best.pt")
        if solved:
            self.solved_flag = True
            if "net" in self._saveables:
                self.save_model("model.pt")
            print(f"Solved in {frame_idx} frames!", flush=True)
        return solved

    # -- exit handling ---------------------------------------------------------------------
    def _on_sigterm(self, signum, frame):
        raise Terminated()

    def __enter__(self):
        signal.signal(signal.SIGTERM, self._on_sigterm)
        # Ctrl-C stops the run even where the shell started it with SIGINT ignored (a
        # background job of a non-interactive shell): Python then never raises KeyboardInterrupt.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return self

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

    def __exit__(self, exc_type, exc, tb):
        # Further signals must not cut the wrap-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code, interrupted, error = 0, None, None
        if exc_type is None:
            pass
        elif issubclass(exc_type, KeyboardInterrupt):
            code, interrupted = EXIT_SIGINT, "SIGINT"
        elif issubclass(exc_type, Terminated):
            code, interrupted = EXIT_SIGTERM, "SIGTERM"
        elif issubclass(exc_type, RunError):
            code, error = EXIT_FAILED, str(exc)
            print(f"{self.prog}: error: {exc}", file=sys.stderr, flush=True)
        else:
            code, error = EXIT_FAILED, f"{exc_type.__name__}: {exc}"
            traceback.print_exception(exc_type, exc, tb)
        self.stop_children()
        if self.args.save_every and error is None and self._saveables and self.frame_idx > self._last_save:
            self.save_checkpoint()  # the end of a run, or the last complete frame before a signal
        self.finish(interrupted=interrupted, error=error)
        sys.stdout.flush()
        sys.exit(code)

    def finish(self, interrupted: str | None = None, error: str | None = None) -> dict:
        try:
            self.writer.flush()
            self.writer.close()
        except Exception:
            pass
        seconds = time.perf_counter() - self._started
        fps = self.speed.fps(self.frame_idx)
        mean = self.tracker.mean_reward
        summary = {
            "stage": self.stage,
            "game": self.game,
            "env": self.params.env_name,
            "seed": self.args.seed,
            "device": str(self.device),
            "frames": self.frame_idx,
            "start_frame": self.start_frame,
            "train_frames": self.speed.frames(self.frame_idx),
            "seconds": round(seconds, 3),
            "fps": round(fps, 2),
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
        path = os.path.join(self.folder, "summary.json")
        with open(path + ".tmp", "w") as f:
            json.dump(summary, f, indent=2)
        os.replace(path + ".tmp", path)
        line = (
            f"RESULT stage={self.stage} game={self.game} frames={self.frame_idx} seconds={seconds:.1f} "
            f"fps={fps:.1f} solved={'yes' if self.solved_flag else 'no'} mean_reward={mean:.3f}"
        )
        if interrupted:
            line += f" interrupted={interrupted}"
        if error:
            line += " error=yes"
        print(line, flush=True)
        return summary
