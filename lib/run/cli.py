"""What every command shares: the errors and their exit codes, a parser that raises instead of
exiting, argument types, device choice, checks of folders, env ids and free memory, the git
commit.

Bad input is a ``UsageError``, a run that cannot go on a ``RunError`` (a file it cannot write:
``WriteError``), SIGTERM ``Terminated``; only a program's entry point turns them into one line
on stderr and an exit code (``usage_exit`` for bad input). A run's own lines go out whole
(``say``). Nothing in this module creates files or folders.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_WRITE = 74  # sysexits EX_IOERR: a file of the run could not be written (disk full, permissions)
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def say(line: str) -> None:
    """Print one line in one write, its newline included: a signal's handler may raise between
    print's two writes (the text, then the newline), and the next line would join this one."""
    print(line + "\n", end="", flush=True)


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


class RunError(Exception):
    """A run that cannot go on (a dead play process, ...): one line, exit code 1."""


class WriteError(RunError):
    """A file of the run could not be written: one line naming it and why, exit code 74."""


class DeviceError(RunError):
    """The device failed under a read of the run's end (a CUDA error is sticky: every later call
    on the device fails too): one line naming the error, exit code 1; what the host holds is kept."""

    @classmethod
    def of(cls, error: RuntimeError) -> DeviceError:
        first = str(error).strip().splitlines()
        return cls(f"device error: {first[0] if first else type(error).__name__}")


class Terminated(BaseException):
    """Raised in the main process by SIGTERM or SIGHUP (its number: ``args[0]``), like
    KeyboardInterrupt for SIGINT."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError instead of printing usage and exiting, and takes
    no abbreviation of a long option (``--prec`` is refused, not read as ``--precision``)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(message)

    def parse_given(self, argv=None) -> tuple[argparse.Namespace, set[str]]:
        """Parse ``argv``; also the long options it gave, as the parser read them (``--seed``,
        ``--precision``): each option given, whatever the value, and none left at its default."""
        args = self.parse_args(argv)
        unset = object()
        saved = [(action, action.default) for action in self._actions]
        try:
            for action, _ in saved:
                action.default = unset
            probe = self.parse_args(argv)
        finally:
            for action, default in saved:
                action.default = default
        given = set()
        for action in self._actions:
            if action.dest != argparse.SUPPRESS and getattr(probe, action.dest, unset) is not unset:
                given.update(s for s in action.option_strings if s.startswith("--"))
        return args, given


def usage_exit(prog: str, error: UsageError) -> int:
    """Print the one line for bad input; return the exit code."""
    print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def count(value: str, least: int = 0) -> int:
    """argparse type: a whole number >= 0 (>= ``least``)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}")
    if n < least:
        raise argparse.ArgumentTypeError(f"expected a number >= {least}, got {n}")
    return n


SEED_MAX = 2**32 - 1  # numpy's global seed (np.random.seed), which every stage and play process sets
INT32_MAX = 2**31 - 1  # ale-py's vector env: one int32 seed per game, consecutive from the one given


def seed(value: str, most: int = SEED_MAX) -> int:
    """argparse type: a seed, a whole number from 0 to ``most``."""
    n = count(value)
    if n > most:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to {most}, got {n}")
    return n


def check_seed(seed: int, offset: int, most: int, where: str) -> None:
    """UsageError unless the seeds from ``seed`` to ``seed + offset`` (the games of a vector env,
    a resumed run's frame) are at most ``most``, which ``where`` takes."""
    if seed + offset > most:
        raise UsageError(
            f"--seed {seed}: {where} takes seeds up to {most}, and this run seeds up to {seed} + {offset} "
            f"(its games and the resume frame); the seed must be at most {max(0, most - offset)}"
        )


def positive(value: str) -> int:
    """argparse type: a whole number >= 1."""
    return count(value, least=1)


def positive_or_auto(value: str) -> int | str:
    """argparse type: a whole number >= 1, or ``auto`` (resolved once the device is known)."""
    return "auto" if value == "auto" else positive(value)


def positive_float(value: str) -> float:
    """argparse type: a finite number > 0."""
    return finite(value, above_zero=True)


def non_negative_float(value: str) -> float:
    """argparse type: a finite number >= 0."""
    return finite(value, above_zero=False)


def finite(value: str, above_zero: bool) -> float:
    """``value`` as a finite number, > 0 or >= 0; ArgumentTypeError (argparse's one line) else."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}")
    if not (0 < x if above_zero else 0 <= x) or x == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number {'>' if above_zero else '>='} 0, got {value}")
    return x


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when available")


def resolve_device(name: str):
    """'auto' -> CUDA when available, else CPU; UsageError for 'cuda' without CUDA."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available (use --device cpu)")
    return torch.device(name)


def check_writable_dir(path: str, flag: str, room: int = 0) -> None:
    """UsageError unless ``path`` is, or could be made as, a folder this user can write, in
    which a name of ``room`` bytes still fits the system's limits on names and paths."""
    probe = os.path.abspath(path)
    _check_lengths(path, probe, flag, room)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {probe} is not a writable folder")


def _check_lengths(path: str, full: str, flag: str, room: int) -> None:
    existing = full
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    longest = max(full.split(os.sep), key=lambda part: len(os.fsencode(part)))
    if len(os.fsencode(longest)) > name_max:
        raise UsageError(f"{flag} {path}: a name in it is longer than {name_max} bytes ({longest[:20]}...)")
    if len(os.fsencode(full)) + 1 + room >= path_max:
        raise UsageError(f"{flag} {path}: the path is too long (the system allows {path_max} bytes)")


def env_exists(env_id: str) -> bool:
    """True if gymnasium knows ``env_id``; "module:Name-v0" imports module first, as make does."""
    import gymnasium as gym

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


def git_commit(root: str = ROOT) -> str:
    """Short hash of the checked-out code, '-dirty' when tracked files changed or files outside
    results/ are untracked (results are written by the very runs that record the commit)."""
    try:

        def git(*args):
            return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10)

        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return "unknown"
        status = git("status", "--porcelain")
        changed = [line for line in status.stdout.splitlines() if line[3:] and not line[3:].startswith("results/")]
        return head.stdout.strip() + ("-dirty" if changed else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
