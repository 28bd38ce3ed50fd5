"""Many runs at once: stages x seeds x games, on this machine or on an existing Ray cluster.

``python -m lib.sweep --stages 05,06,07 --seeds 0-4 --games pong --max-frames 1000000
[--per-run-cpus C] [--per-run-gpus G] [--address HOST:PORT] [--out DIR] [-- STAGE FLAGS]``

Each run is one stage script started exactly as a user would start it (``python NN_name.py
--seed S --game G --max-frames F --run-dir DIR --save-every X --quiet --progress SEC``), so a
sweep measures the same code as a single run. Flags after a lone ``--`` go to every run
(``-- --replay-initial 1000``); a stage's own knob (``--steps``, ``--envs``) goes only to the
stages that have it. The flags the sweep sets itself cannot be passed through.

Where runs go:
- this machine (the default, no extra dependency): runs start side by side while the cores and
  GPUs allow (``--per-run-gpus 0.25`` packs four runs on one GPU), the rest wait their turn;
  every run is a process group of its own, ended on Ctrl-C or SIGTERM;
- ``--address HOST:PORT``: each run is a Ray task on that existing cluster, asking for the
  given CPUs and GPUs (``pip install -e ".[cluster]"`` on every node, same commit). Nothing is
  shared but Ray's object store: a run's files travel back to the driver as bytes.
The code that starts a run, watches it and brings its files back (``execute``) and the code
that files the outcome (``Sweep``) are the same for both.

The output folder (``--out``, default ``runs/sweep``)::

    README.md      command, commit, hardware, wall time, the runs, seed statistics, verdict
    curves.png     reward_100 per stage, mean over seeds with a 95% bootstrap band (lib.curves)
    sweep.json     the grid, each run's state, the invocations
    runs/<stage>-<game>-seed<S>/   summary.json, the event files, run.log, checkpoint.pt, best.pt

Running the same command again skips finished runs and continues unfinished ones from their
checkpoint (a larger ``--max-frames`` lets finished runs grow). A run whose process or node dies
is retried once, from the last checkpoint the driver received, then reported failed with its log.
Bad input (an unknown stage or game, an empty seed range, a nonsense number, a bad address, a
stage flag no stage takes) gets one line on stderr and exit code 2, and nothing starts. Exit
code 1 when a run failed, 130 / 143 on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import codecs
import collections
import dataclasses
import datetime
import glob
import json
import os
import queue
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import torch

from lib import cli, curves, runner
from lib.bench import machine
from lib.cli import EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, UsageError
from lib.params import GAMES
from lib.runner import Terminated
from lib.stages import ROOT, STAGES, parse_stages

ATTEMPTS = 2  # a run that dies is started once more, then reported failed
SAVE_EVERY = 50_000  # agent steps between a run's checkpoints: what a retry can lose
PROGRESS_SEC = 30.0
STOP_GRACE = 15.0  # seconds a stopped run gets to write its checkpoint and summary before SIGKILL
LEVELS = [-15.0, 0.0, 18.0]
# Stage flags the sweep sets for every run, and what to do instead.
OWNED = {
    "seed": "use --seeds", "game": "use --games", "max_frames": "use --max-frames", "run_dir": "use --out",
    "resume": "a rerun resumes unfinished runs", "save_every": "use --save-every", "quiet": "it is always on",
    "progress": "use --progress", "device": "use --per-run-gpus", "cuda": "use --per-run-gpus",
}  # fmt: skip
# A run's folder: what comes back at the end (and, while it runs, each time it saves a checkpoint).
FILE_PATTERNS = ("summary.json", "events.out.tfevents.*", "checkpoint.pt", "best.pt", "model.pt")
LIVE_PATTERNS = ("checkpoint.pt", "events.out.tfevents.*")
LOG = "run.log"
ACTIVE = ("waiting", "running")  # a Job handed to the pool, before and after its process started


# -- the grid ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of the grid: everything a node needs to start it."""

    stage: str
    game: str
    seed: int
    max_frames: int | None
    save_every: int
    progress: float
    flags: tuple[str, ...]  # pass-through flags, already routed to this stage
    cpus: float
    gpus: float

    @property
    def key(self) -> str:
        return f"{self.stage}-{self.game}-seed{self.seed}"

    def argv(self) -> list[str]:
        """The stage's command line, less the script and the run folder."""
        out = ["--seed", str(self.seed), "--game", self.game]
        if self.max_frames is not None:
            out += ["--max-frames", str(self.max_frames)]
        out += ["--device", "cuda" if self.gpus > 0 else "cpu", "--save-every", str(self.save_every)]
        out += ["--quiet", "--progress", f"{self.progress:g}", *self.flags]
        return out


def parse_seeds(text: str) -> list[int]:
    """'0-4' -> [0..4]; '1,3,7-8' -> [1, 3, 7, 8]; UsageError on anything else or nothing."""
    seeds = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\s*-\s*(\d+))?\s*", part)
        if not m:
            raise UsageError(f"--seeds {text!r}: expected N, A-B or a comma list of those")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise UsageError(f"--seeds {text!r}: the range {lo}-{hi} is empty")
        if hi >= 2**31:
            raise UsageError(f"--seeds {text!r}: seeds must be below {2**31}")
        if hi - lo >= 10_000:
            raise UsageError(f"--seeds {text!r}: {hi - lo + 1} seeds is more than a sweep can hold")
        seeds.update(range(lo, hi + 1))
    return sorted(seeds)


def parse_games(text: str) -> list[str]:
    games = []
    for part in text.split(","):
        game = part.strip().lower()
        if game not in GAMES:
            raise UsageError(f"--games: unknown game {part.strip()!r} (known: {', '.join(GAMES)})")
        if game not in games:
            games.append(game)
    return games


def _flag_groups(flags: list[str]) -> list[list[str]]:
    """['--a', '1', '--b=2', '--c'] -> [['--a', '1'], ['--b=2'], ['--c']]."""
    groups: list[list[str]] = []
    for token in flags:
        if token.startswith("--"):
            groups.append([token])
        elif token.startswith("-") and not re.fullmatch(r"-[\d.]+", token):
            raise UsageError(f"-- {token}: stage flags are long flags (--name)")
        elif not groups:
            raise UsageError(f"-- {token}: expected a stage flag (--name) after --")
        else:
            groups[-1].append(token)
    return groups


def route_flags(flags: list[str], stages: list[str]) -> dict[str, list[str]]:
    """Each stage's share of the pass-through flags: a stage knob (``--steps``, ``--envs``)
    goes only to the stages that have it, every other flag to all of them."""
    knobs = {k for s in STAGES.values() for k in s.knobs}
    out: dict[str, list[str]] = {s: [] for s in stages}
    for group in _flag_groups(flags):
        name = group[0][2:].split("=", 1)[0]
        takers = [s for s in stages if name not in knobs or name in STAGES[s].knobs]
        if not takers:
            raise UsageError(f"-- --{name}: none of stages {', '.join(stages)} has this flag")
        for s in takers:
            out[s] += group
    return out


def check_stage_flags(stage: str, flags: list[str], games: list[str]) -> None:
    """UsageError unless the stage's own command line takes ``flags`` and they leave the flags
    the sweep sets alone. Stops short of what only a started run can find out."""
    parser = runner.make_parser(stage, None)
    for knob in STAGES[stage].knobs:
        parser.add_argument(f"--{knob}", type=int)
    try:
        args = parser.parse_args(flags)
    except UsageError as e:
        raise UsageError(f"stage {stage}: {e}")
    for dest, instead in OWNED.items():
        if getattr(args, dest) != parser.get_default(dest):
            raise UsageError(f"-- --{dest.replace('_', '-')}: the sweep sets it for every run ({instead})")
    for knob in STAGES[stage].knobs:
        value = getattr(args, knob)
        if value is not None and value < 1:
            raise UsageError(f"stage {stage}: --{knob} must be at least 1, got {value}")
    for game in games:
        size = args.replay_size or GAMES[game].replay_size
        initial = args.replay_initial or GAMES[game].replay_initial
        if initial > size:
            raise UsageError(f"--replay-initial {initial} is larger than the replay size {size} ({game})")


def plan(args) -> list[RunSpec]:
    """The grid, seed by seed, so that early results cover every stage."""
    try:
        stages = parse_stages(args.stages)
    except ValueError as e:
        raise UsageError(f"--stages: {e}")
    seeds, games = parse_seeds(args.seeds), parse_games(args.games)
    routed = route_flags(args.flags, stages)
    for stage in stages:
        if routed[stage]:
            check_stage_flags(stage, routed[stage], games)
    runs = [
        RunSpec(stage, game, seed, args.max_frames, args.save_every, args.progress, tuple(routed[stage]),
                args.per_run_cpus, args.per_run_gpus)
        for seed in seeds for game in games for stage in stages
    ]  # fmt: skip
    if len(runs) > 10_000:
        raise UsageError(f"{len(runs)} runs is more than a sweep can hold")
    return runs


# -- one run: the same code on this machine and on a Ray node -------------------------------

# Started as ``python -c _LAUNCH PARENT_PID SCRIPT ARGS``: asks Linux to send SIGTERM when the
# parent thread goes (a killed driver or Ray worker, a lost node), then becomes the stage
# script itself (same pid, same command line as a user's).
_LAUNCH = """import os, signal, sys
if sys.platform.startswith("linux"):
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(sys.argv[1]):
        os._exit(143)
os.execv(sys.executable, [sys.executable] + sys.argv[2:])
"""


def _exited(pid: int) -> bool:
    """The process exited; it is not reaped, so its pid and group id stay reserved."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # all gone already


def _end_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the run's process group (the stage saves a checkpoint and its summary), SIGKILL
    it after ``grace`` seconds, reap it. Helpers still alive after the stage exited are killed."""
    if not _exited(proc.pid):
        _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while not _exited(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def _collect(folder: str | None, patterns=FILE_PATTERNS) -> dict[str, bytes]:
    files = {}
    if folder is None:
        return files
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.join(folder, pattern))):
            try:
                with open(path, "rb") as f:
                    files[os.path.basename(path)] = f.read()
            except OSError:
                pass  # replaced under us: the next look gets the new one
    return files


def child_env(spec: RunSpec, gpu_ids) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    threads = str(max(1, int(spec.cpus)))
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)  # none asked: none seen
    return env


def _prepare(spec: RunSpec, work: str, resume: dict[str, bytes] | None) -> tuple[list[str], str | None]:
    """The stage's arguments, and the run folder when it is known before the stage starts: a
    resumed run continues in a folder holding the earlier attempt's files."""
    argv = spec.argv()
    if not resume:
        return argv + ["--run-dir", work], None
    folder = os.path.join(work, spec.key)
    os.makedirs(folder)
    for name, data in resume.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return argv + ["--resume", os.path.join(folder, "checkpoint.pt")], folder


def _read_ready(fd: int, decoder, poll: float) -> tuple[str, bool]:
    """The output that arrives within ``poll`` seconds, and whether the stage closed its end."""
    ready, _, _ = select.select([fd], [], [], poll)
    text = ""
    while ready:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            return text, True
        text += decoder.decode(chunk)
    return text, False


def _follow(proc: subprocess.Popen, work: str, folder: str | None, stop, kill, poll: float):
    """Yield the stage's output (``log``) and, each time it saves a checkpoint, its checkpoint
    and event files (``files``) until it exits; return its run folder. ``stop``: SIGTERM its
    group, SIGKILL after STOP_GRACE seconds; ``kill``: SIGKILL at once."""
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    seen, stopping, kill_at, eof = None, False, None, False
    while True:
        text = ""
        if not eof:
            text, eof = _read_ready(fd, decoder, poll)
        if text:
            yield "log", text
        if folder is None:
            found = [d for d in glob.glob(os.path.join(work, "*")) if os.path.isdir(d)]
            folder = found[0] if found else None
        ckpt = os.path.join(folder, "checkpoint.pt") if folder else None
        if ckpt and os.path.exists(ckpt):
            st = os.stat(ckpt)
            if (st.st_mtime_ns, st.st_size) != seen:
                seen = (st.st_mtime_ns, st.st_size)
                yield "files", _collect(folder, LIVE_PATTERNS)
        if stop is not None and stop.is_set() and not stopping:
            stopping, kill_at = True, time.monotonic() + STOP_GRACE
            _signal_group(proc.pid, signal.SIGTERM)
        if (kill_at is not None and time.monotonic() > kill_at) or (kill is not None and kill.is_set()):
            _signal_group(proc.pid, signal.SIGKILL)
            kill_at, kill = None, None
        if _exited(proc.pid):
            if not eof:  # what the stage wrote last
                tail = _read_rest(fd, decoder)
                if tail:
                    yield "log", tail
            return folder
        if eof:
            time.sleep(min(poll, 0.2))


def _read_rest(fd: int, decoder) -> str:
    """What the stage wrote last, once it has exited."""
    time.sleep(0.1)
    try:
        rest = os.read(fd, 1 << 20)
    except (BlockingIOError, OSError):
        rest = b""
    return decoder.decode(rest, final=True)


def execute(
    spec: RunSpec, parent: str, resume: dict[str, bytes] | None = None, gpu_ids=(), stop=None, kill=None, poll=1.0
):
    """Run one stage process in a fresh folder under ``parent`` and yield what happens, as
    ``(kind, payload)``: ``start`` (host, pid, command), ``log`` (new output), ``files`` (the
    checkpoint and event files, each time the stage saves a checkpoint) and last ``end``
    (exit code and the run folder's files). ``resume``: files of an earlier attempt (its
    checkpoint and event files) to continue from. ``stop`` (a threading.Event) asks the run to
    end as Ctrl-C would (SIGTERM, SIGKILL after STOP_GRACE seconds); ``kill``, at once. However
    the generator ends (closed, cancelled, an error), nothing of the process group outlives it
    and the folder is removed."""
    script = STAGES[spec.stage].path
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"{spec.key}-p{os.getpid()}-", dir=parent)
    proc = None
    try:
        argv, folder = _prepare(spec, work, resume)
        cmd = [sys.executable, "-c", _LAUNCH, str(os.getpid()), script, *argv]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env(spec, gpu_ids), start_new_session=True,
        )  # fmt: skip
        yield (
            "start",
            {"host": socket.gethostname(), "pid": proc.pid, "command": shlex.join([sys.executable, script, *argv])},
        )
        folder = yield from _follow(proc, work, folder, stop, kill, poll)
        _end_group(proc, grace=0.0)  # the stage is gone: only stragglers of its group are killed
        code = proc.returncode
        proc = None
        yield "end", {"code": code, "files": _collect(folder)}
    finally:
        if proc is not None:
            _end_group(proc, grace=STOP_GRACE)
        shutil.rmtree(work, ignore_errors=True)


def clear_stale(parent: str) -> None:
    """Remove the folders of runs whose follower process is gone: a worker that died with its
    node never removed its own."""
    for path in glob.glob(os.path.join(parent, "*-p*-*")):
        m = re.search(r"-p(\d+)-[^-]*$", path)
        if not m:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass  # another user's process: alive


def _ray_attempt(spec: RunSpec, resume: dict[str, bytes] | None):
    """The Ray task: ``execute`` on whichever node Ray chose, in that node's temp folder."""
    import ray  # ray is optional (the "cluster" extra): imported only where a sweep uses it

    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    node = ray.get_runtime_context().get_node_id()
    parent = os.path.join(tempfile.gettempdir(), "dqn-sweep")
    clear_stale(parent)
    for kind, payload in execute(spec, parent, resume, gpu_ids):
        if kind == "start":
            payload["node"] = node
        yield kind, payload


# -- where runs go ----------------------------------------------------------------------------


def _visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES entries."""
    if sys.platform.startswith("linux") and not glob.glob("/dev/nvidia[0-9]*"):
        return []  # no NVIDIA device node: no need to ask CUDA to know
    try:
        count = torch.cuda.device_count()
    except RuntimeError:
        count = 0
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()][:count]
    return [str(i) for i in range(count)]


class LocalPool:
    """Runs on this machine, each in a thread of the driver that follows its process."""

    kind = "local"

    def __init__(self, cpus: float, gpus: float | None, parent: str, cores: int | None = None, gpu_names=None):
        """``cores``, ``gpu_names``: this machine's, unless given (CUDA_VISIBLE_DEVICES entries)."""
        if cores is None:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        self.total_cpus = cores
        if gpu_names is None:
            gpu_names = _visible_gpus() if gpus is None or gpus > 0 else []
        self.gpu_names = list(gpu_names)
        self.cpus = cpus
        self.gpus = gpus if gpus is not None else (1.0 if self.gpu_names else 0.0)
        self.parent = parent
        self.events: queue.Queue = queue.Queue()
        self.free_cpus = float(self.total_cpus)
        self.free_gpus = [1.0] * len(self.gpu_names)
        self.held: dict = {}  # token -> [(gpu index, share)] of a running run
        self.stops: dict = {}  # token -> (stop, kill) events
        self.threads: dict = {}

    def check(self) -> None:
        if self.cpus > self.total_cpus + 1e-9:
            raise UsageError(f"--per-run-cpus {self.cpus:g}: this machine has {self.total_cpus} cores")
        if self.gpus > 0 and not self.gpu_names:
            raise UsageError(f"--per-run-gpus {self.gpus:g}: this machine has no CUDA GPU")
        if self.gpus > len(self.gpu_names):
            raise UsageError(f"--per-run-gpus {self.gpus:g}: this machine has {len(self.gpu_names)} GPUs")

    def describe(self) -> str:
        share = f"{self.gpus:g} GPU" if self.gpus else "no GPU"
        return (
            f"this machine ({self.total_cpus} cores, {len(self.gpu_names)} GPUs); per run {self.cpus:g} CPUs, "
            f"{share}: {self.slots()} at a time"
        )

    def slots(self) -> int:
        n = int(self.total_cpus / self.cpus + 1e-9)
        if 0 < self.gpus <= 1:
            n = min(n, len(self.gpu_names) * int(1 / self.gpus + 1e-9))
        elif self.gpus > 1:
            n = min(n, len(self.gpu_names) // int(self.gpus))
        return max(n, 1)

    def _gpu_pick(self):
        if self.gpus <= 0:
            return []
        if self.gpus <= 1:
            for i, free in enumerate(self.free_gpus):
                if free >= self.gpus - 1e-9:
                    return [(i, self.gpus)]
            return None
        whole = [i for i, free in enumerate(self.free_gpus) if free >= 1 - 1e-9]
        return [(i, 1.0) for i in whole[: int(self.gpus)]] if len(whole) >= self.gpus else None

    def can_start(self) -> bool:
        return self.free_cpus >= self.cpus - 1e-9 and self._gpu_pick() is not None

    def reserve(self, token) -> list[str]:
        """Take a run's share of the cores and GPUs (can_start() said there is one); its GPUs."""
        picks = self._gpu_pick()
        self.free_cpus -= self.cpus
        for i, share in picks:
            self.free_gpus[i] -= share
        self.held[token] = picks
        return [self.gpu_names[i] for i, _ in picks]

    def release(self, token) -> None:
        picks = self.held.pop(token, None)
        if picks is None:
            return
        self.free_cpus += self.cpus
        for i, share in picks:
            self.free_gpus[i] += share
        self.stops.pop(token, None)

    def start(self, token, spec: RunSpec, resume) -> None:
        gpu_ids = self.reserve(token)
        stop, kill = self.stops[token] = (threading.Event(), threading.Event())

        def follow():
            try:
                for kind, payload in execute(spec, self.parent, resume, gpu_ids, stop, kill):
                    self.events.put((token, kind, payload))
            except Exception as e:  # noqa: BLE001  (whatever stops the follower, the run counts as dead)
                self.events.put((token, "died", f"{type(e).__name__}: {e}"))

        thread = self.threads[token] = threading.Thread(target=follow, name=f"run-{spec.key}", daemon=True)
        thread.start()

    def poll(self, timeout: float) -> list:
        out = []
        try:
            item = self.events.get(timeout=timeout)
            while True:
                out.append(item)
                if item[1] in ("end", "died"):
                    self.release(item[0])
                item = self.events.get_nowait()
        except queue.Empty:
            pass
        return out

    def stop(self) -> None:
        for stop, _ in self.stops.values():
            stop.set()

    def kill(self) -> None:
        """A second Ctrl-C: no more grace."""
        for stop, kill in self.stops.values():
            stop.set()
            kill.set()

    def close(self) -> None:
        for thread in self.threads.values():
            thread.join(timeout=STOP_GRACE + 5)


def _check_address(address: str) -> tuple[str, int]:
    m = re.fullmatch(r"\[?([^\s\[\]]+?)\]?:(\d+)", address)
    if not m or not (0 < int(m.group(2)) < 65536):
        raise UsageError(f"--address {address!r}: expected HOST:PORT of a Ray cluster's head (ray start --head)")
    host, port = m.group(1), int(m.group(2))
    try:
        with socket.create_connection((host, port), timeout=5):
            pass
    except OSError as e:
        raise UsageError(f"--address {address}: nothing answers there ({e.strerror or type(e).__name__})")
    return host, port


class RayPool:
    """Runs as Ray tasks on an existing cluster; Ray queues what does not fit yet."""

    kind = "ray"

    def __init__(self, address: str, cpus: float, gpus: float | None):
        self.address, self.cpus, self.gpus = address, cpus, gpus
        self.gens: dict = {}  # token -> ObjectRefGenerator

    def connect(self) -> None:
        _check_address(self.address)
        try:
            import ray  # optional (the "cluster" extra): a sweep on this machine runs without it
        except ImportError:
            raise UsageError('--address needs Ray on this machine: pip install -e ".[cluster]"')
        self.ray = ray
        # A port that answers but is not Ray's: ray.init would keep trying.
        watchdog = threading.Timer(60.0, self._no_answer)
        watchdog.daemon = True
        watchdog.start()
        try:
            ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
        except Exception as e:  # noqa: BLE001  (Ray raises several kinds here; all mean the same to a user)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UsageError(f"--address {self.address}: cannot join the Ray cluster ({first})")
        finally:
            watchdog.cancel()
        self.nodes = [n for n in ray.nodes() if n.get("Alive")]
        has_gpus = any(n["Resources"].get("GPU", 0) > 0 for n in self.nodes)
        if self.gpus is None:
            self.gpus = 1.0 if has_gpus else 0.0
        fits = [
            n for n in self.nodes
            if n["Resources"].get("CPU", 0) >= self.cpus - 1e-9 and n["Resources"].get("GPU", 0) >= self.gpus - 1e-9
        ]  # fmt: skip
        if not fits:
            ray.shutdown()
            raise UsageError(
                f"no node of the cluster at {self.address} offers {self.cpus:g} CPUs and {self.gpus:g} GPUs "
                f"(--per-run-cpus, --per-run-gpus)"
            )
        self.task = ray.remote(_ray_attempt).options(
            num_cpus=self.cpus, num_gpus=self.gpus, max_retries=0, num_returns="streaming"
        )

    def _no_answer(self) -> None:
        print(f"sweep: error: --address {self.address}: no Ray cluster answered within 60 s", file=sys.stderr)
        os._exit(EXIT_USAGE)

    def check(self) -> None:
        pass  # done in connect(), against the cluster's nodes

    def describe(self) -> str:
        cpus = sum(n["Resources"].get("CPU", 0) for n in self.nodes)
        gpus = sum(n["Resources"].get("GPU", 0) for n in self.nodes)
        share = f"{self.gpus:g} GPU" if self.gpus else "no GPU"
        return (
            f"Ray cluster at {self.address} ({len(self.nodes)} nodes, {cpus:g} CPUs, {gpus:g} GPUs); "
            f"per run {self.cpus:g} CPUs, {share}"
        )

    def can_start(self) -> bool:
        return True

    def start(self, token, spec: RunSpec, resume) -> None:
        self.gens[token] = self.task.remote(spec, resume)

    def poll(self, timeout: float) -> list:
        ray = self.ray
        if not self.gens:
            time.sleep(timeout)
            return []
        gens = list(self.gens.values())
        ready, _ = ray.wait(gens, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(gens, num_returns=len(gens), timeout=0)
        by_gen = {id(g): t for t, g in self.gens.items()}
        out = []
        for gen in ready:
            token = by_gen[id(gen)]
            try:
                kind, payload = ray.get(next(gen))
            except StopIteration:
                del self.gens[token]
                out.append((token, "died", "the task ended without a result"))
                continue
            except ray.exceptions.RayError as e:
                del self.gens[token]
                out.append((token, "died", _ray_reason(e)))
                continue
            if kind == "end":
                del self.gens[token]  # the task only cleans up now
            out.append((token, kind, payload))
        return out

    def stop(self) -> None:
        for gen in self.gens.values():
            self.ray.cancel(gen)  # KeyboardInterrupt in the task: execute ends its process group

    def kill(self) -> None:
        for gen in self.gens.values():
            self.ray.cancel(gen, force=True)  # the worker dies; its stage gets SIGTERM (_LAUNCH)

    def close(self) -> None:
        self.ray.shutdown()


def _ray_reason(e: Exception) -> str:
    name = type(e).__name__
    if "TaskCancelled" in name or "TaskCancelled" in str(e)[:300]:
        return "cancelled"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{name}: {first}"[:300]


# -- the driver: the same for both --------------------------------------------------------------


@dataclasses.dataclass
class Job:
    spec: RunSpec
    status: str = "queued"  # queued, waiting (handed to the pool), running, done, skipped, failed, interrupted
    attempts: int = 0
    frame: int = 0  # the run's latest agent step known here
    last_progress: int | None = None  # this attempt's latest PROGRESS frame
    token: int | None = None
    host: str | None = None
    node: str | None = None
    pid: int | None = None
    reason: str | None = None
    partial: str = ""  # an unfinished output line


def _store(folder: str, files: dict[str, bytes]) -> None:
    """Files that came back from a run, each written whole or not at all."""
    for name, data in files.items():
        runner.atomic_write(os.path.join(folder, name), lambda f, data=data: f.write(data))


def _read_summary(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def run_complete(folder: str, max_frames: int | None) -> bool:
    """The run's summary says it ended on its own (solved, or at --max-frames or past it)."""
    s = _read_summary(folder)
    if not s or s.get("interrupted") or s.get("error"):
        return False
    return bool(s.get("solved")) or (max_frames is not None and (s.get("frames") or 0) >= max_frames)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{max(seconds, 0):.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 0)} min"


class Sweep:
    """Starts, follows and files the runs of a grid through a pool (LocalPool or RayPool)."""

    def __init__(self, jobs: list[Job], out: str, pool, progress: float, log=None):
        self.jobs = {j.spec.key: j for j in jobs}
        self.out, self.pool, self.progress = out, pool, progress
        self.log = log or (lambda line: print(line, flush=True))
        self.runs_dir = os.path.join(out, "runs")
        self.by_token: dict = {}
        self.next_token = 0
        self.queue: collections.deque = collections.deque()
        self.stopping: int | None = None
        self.t0 = time.monotonic()
        self.frames_here = 0  # agent steps run during this invocation, for the ETA

    def folder(self, job: Job) -> str:
        return os.path.join(self.runs_dir, job.spec.key)

    # -- one attempt ---------------------------------------------------------------------
    def _launch(self, job: Job) -> None:
        folder = self.folder(job)
        os.makedirs(folder, exist_ok=True)
        resume = None
        if os.path.exists(os.path.join(folder, "checkpoint.pt")):
            resume = _collect(folder, LIVE_PATTERNS)
        else:  # a fresh start: files of an earlier attempt would mix into its curve
            for name in os.listdir(folder):
                if name != LOG:
                    os.remove(os.path.join(folder, name))
        job.attempts += 1
        job.status, job.token, job.partial = "waiting", self.next_token, ""
        job.host = job.node = job.pid = job.last_progress = None
        self.by_token[self.next_token] = job
        self.next_token += 1
        how = "from its checkpoint" if resume else "from the start"
        with open(os.path.join(folder, LOG), "a") as f:
            f.write(f"== attempt {job.attempts}, {how}, {datetime.datetime.now().isoformat(timespec='seconds')}\n")
        self.pool.start(job.token, job.spec, resume)

    def _handle(self, token, kind: str, payload) -> None:
        job = self.by_token.get(token)
        if job is None or job.token != token:
            return  # an earlier attempt's last words
        folder = self.folder(job)
        if kind == "start":
            job.status = "running"
            job.host, job.node, job.pid = payload["host"], payload.get("node"), payload["pid"]
            where = f"{job.host}" + (f" node {job.node}" if job.node else "")
            self.log(f"run {job.spec.key}: started (attempt {job.attempts}) on {where}, pid {job.pid}")
            with open(os.path.join(folder, LOG), "a") as f:
                f.write(f"== {payload['command']}\n== on {where}, pid {job.pid}\n")
        elif kind == "log":
            with open(os.path.join(folder, LOG), "a") as f:
                f.write(payload)
            lines = (job.partial + payload).split("\n")
            job.partial = lines.pop()
            for line in lines:
                m = re.match(r"PROGRESS .*\bframe=(\d+)", line)
                if m:
                    frame = int(m.group(1))
                    if job.last_progress is not None:
                        self.frames_here += max(0, frame - job.last_progress)
                    job.last_progress = job.frame = frame
        elif kind == "files":
            _store(folder, payload)
        elif kind == "end":
            _store(folder, payload["files"])
            self._ended(job, payload["code"], None)
        elif kind == "died":
            self._ended(job, None, payload)

    def _ended(self, job: Job, code: int | None, died: str | None) -> None:
        job.token = None
        key, folder = job.spec.key, self.folder(job)
        summary = (_read_summary(folder) if code is not None else None) or {}
        if summary:
            job.frame = summary.get("frames") or job.frame
        if code == 0 and run_complete(folder, job.spec.max_frames):
            job.status, job.reason = "done", None
            took = f", {summary['seconds'] / 60:.1f} min" if summary.get("seconds") else ""
            self.log(f"run {key}: done, {job.frame} frames{took}" + (", solved" if summary.get("solved") else ""))
            return
        if died:
            reason = died
        elif code is not None and code < 0:
            reason = f"killed by {_signal_name(-code)}"
        else:
            reason = f"exit code {code}" if code else "ended without finishing"
        if self.stopping is not None:
            job.status, job.reason = "interrupted", reason
            return
        if code == EXIT_USAGE:  # the stage refused its input: another try would too
            job.status, job.reason = "failed", f"the stage refused its input ({self._last_line(job)})"
        elif job.attempts < ATTEMPTS:
            ckpt = os.path.exists(os.path.join(folder, "checkpoint.pt"))
            self.log(f"run {key}: {reason}; retrying " + ("from its last checkpoint" if ckpt else "from the start"))
            job.status = "queued"
            self.queue.appendleft(job)
            return
        else:
            job.status, job.reason = "failed", reason
        self.log(f"run {key}: FAILED ({job.reason}); log: {os.path.join(folder, LOG)}")
        for line in self._tail(job, 5):
            self.log(f"    {line}")

    def _tail(self, job: Job, n: int) -> list[str]:
        try:
            with open(os.path.join(self.folder(job), LOG), errors="replace") as f:
                lines = [line.rstrip() for line in f if line.strip() and not line.startswith("==")]
            return lines[-n:]
        except OSError:
            return []

    def _last_line(self, job: Job) -> str:
        tail = self._tail(job, 1)
        return tail[0] if tail else "no output"

    # -- the loop --------------------------------------------------------------------------
    def active(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.status in ACTIVE]

    def counts(self) -> collections.Counter:
        return collections.Counter(j.status for j in self.jobs.values())

    def progress_line(self) -> str:
        c = self.counts()
        head = (
            f"sweep: {c['done'] + c['skipped']}/{len(self.jobs)} done, {c['running']} running, {c['failed']} failed, "
            f"{c['queued'] + c['waiting']} queued" + (f", {c['interrupted']} interrupted" if c["interrupted"] else "")
        )
        left = None
        limits = [j.spec.max_frames for j in self.jobs.values()]
        if all(m is not None for m in limits):
            left = sum(
                max(0, j.spec.max_frames - j.frame) for j in self.jobs.values() if j.status in ACTIVE + ("queued",)
            )
        elapsed = time.monotonic() - self.t0
        if left == 0 or left is None:
            eta = "—" if left is None else "0 min"
        elif self.frames_here > 0 and elapsed > 0:
            eta = _duration(left / (self.frames_here / elapsed))
        else:
            eta = "—"
        return f"{head}; ETA {eta}"

    def run(self) -> None:
        for job in self.jobs.values():
            if job.status == "queued":
                self.queue.append(job)
        next_line = time.monotonic() + self.progress
        while self.queue or self.active():
            while self.queue and self.stopping is None and self.pool.can_start():
                self._launch(self.queue.popleft())
            for token, kind, payload in self.pool.poll(timeout=1.0):
                self._handle(token, kind, payload)
            if self.stopping is not None and not self.active():
                break
            if time.monotonic() >= next_line:
                next_line += self.progress
                self.log(self.progress_line())

    def stop(self, code: int) -> None:
        """Ctrl-C or SIGTERM: every running run is asked to end; their files still come back."""
        self.stopping = code
        self.log(f"sweep: stopping {len(self.active())} runs")
        self.pool.stop()
        deadline = time.monotonic() + STOP_GRACE + 15
        while self.active() and time.monotonic() < deadline:
            for token, kind, payload in self.pool.poll(timeout=0.5):
                self._handle(token, kind, payload)
        for job in self.active():
            job.status, job.reason = "interrupted", "did not answer the stop"

    def kill(self) -> None:
        self.pool.kill()
        for job in self.active():
            job.status, job.reason = "interrupted", "killed"


# -- the report ---------------------------------------------------------------------------------


def _hardware(pool) -> list[str]:
    if pool.kind == "ray":
        lines = [f"- where: {pool.describe()}"]
        for n in pool.nodes:
            res = n["Resources"]
            lines.append(
                f"  - node {n.get('NodeManagerHostname', '?')} ({n.get('NodeID', '?')[:12]}): "
                f"{res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs, {res.get('memory', 0) / 2**30:.1f} GiB"
            )
        return lines
    gpus = ""
    if pool.gpu_names:
        gpus = ", GPUs: " + ", ".join(torch.cuda.get_device_name(i) for i in range(len(pool.gpu_names)))
    mem = machine.memory_gib()
    return [
        f"- where: {pool.describe()}",
        f"- hardware: {machine.cpu_model()}, {pool.total_cpus} cores" + (f", {mem} GiB" if mem else "") + gpus,
    ]


def _runs_table(sweep: Sweep) -> tuple[list[str], dict]:
    """The README's row of each run, and each run's state for sweep.json."""
    rows, states = [], {}
    for key, job in sweep.jobs.items():
        s = _read_summary(sweep.folder(job)) or {}
        states[key] = {
            "status": job.status, "attempts": job.attempts, "frames": s.get("frames", job.frame or None),
            "host": job.host, "node": job.node, "reason": job.reason,
        }  # fmt: skip
        minutes = f"{s['seconds'] / 60:.1f}" if s.get("seconds") is not None else "—"
        fps = f"{s['fps']:.1f}" if s.get("fps") is not None else "—"
        mean = f"{s['mean_reward']:.1f}" if s.get("mean_reward") is not None else "—"
        solved = {True: "yes", False: "no"}.get(s.get("solved"), "—")
        status = "done before" if job.status == "skipped" else job.status
        rows.append(
            f"| {key} | {status} | {s.get('frames', '—')} | {minutes} | {fps} | {mean} | {solved} | "
            f"{job.attempts} | {job.host or '—'} |"
        )
    return rows, states


def _save_state(out: str, meta: dict, states: dict) -> list[dict]:
    """sweep.json: the grid, each run's state, and this invocation after the earlier ones (returned)."""
    state_path = os.path.join(out, "sweep.json")
    try:
        with open(state_path) as f:
            invocations = json.load(f).get("invocations", [])
    except (OSError, ValueError, AttributeError):
        invocations = []
    invocations.append({k: meta[k] for k in ("command", "commit", "date", "wall_s", "where", "outcome")})
    state = json.dumps({"grid": meta["grid"], "runs": states, "invocations": invocations}, indent=2)
    runner.atomic_write(state_path, lambda f: f.write(state.encode()))
    return invocations


def _seeds_section(out: str, sweep: Sweep) -> str:
    """The seed statistics of the runs that logged anything (curves.md, curves.png), as Markdown."""
    seeds_md = ""
    have = [sweep.folder(j) for j in sweep.jobs.values() if glob.glob(os.path.join(sweep.folder(j), "events.*"))]
    if have:
        stats = curves.seed_stats(have, LEVELS)
        seeds_md = curves.seed_markdown(stats, LEVELS)
        if any(g["frames"] is not None for g in stats["groups"].values()):
            curves.plot_seeds(stats, LEVELS, os.path.join(out, "curves.png"))
            seeds_md = "![reward_100 per stage](curves.png)\n\n" + seeds_md
        with open(os.path.join(out, "curves.md"), "w") as f:
            f.write(seeds_md + "\n")
    return seeds_md


def write_report(out: str, sweep: Sweep, meta: dict) -> None:
    """README.md, sweep.json and the seed statistics (curves.png, curves.md) of the folder."""
    rows, states = _runs_table(sweep)
    invocations = _save_state(out, meta, states)
    seeds_md = _seeds_section(out, sweep)
    total_wall = sum(inv.get("wall_s") or 0 for inv in invocations)
    failed = [(k, j) for k, j in sweep.jobs.items() if j.status == "failed"]
    lines = [
        f"# Sweep: stages {meta['grid']['stages']} x seeds {meta['grid']['seeds']} x {meta['grid']['games']}",
        "",
        f"- command: `{meta['command']}`",
        f"- commit: {meta['commit']}; date: {meta['date']}",
        *_hardware(sweep.pool),
        (
            f"- wall time: {_duration(meta['wall_s'])} this invocation ({meta['outcome']}), "
            f"{_duration(total_wall)} over {len(invocations)} invocation(s)"
        ),
        f"- {sweep.progress_line().removeprefix('sweep: ').split('; ETA')[0]}",
        "",
        "## Runs",
        "",
        "| run | status | frames | minutes | f/s | mean reward | solved | attempts | host |",
        "|---|---|---:|---:|---:|---:|---|---:|---|",
        *rows,
    ]
    if failed:
        lines += ["", "Failed runs (their logs are in `runs/<run>/run.log`):", ""]
        for key, job in failed:
            lines.append(f"- {key}: {job.reason}")
            lines += [f"    {line}" for line in sweep._tail(job, 5)]
    lines += ["", "## Seeds", "", seeds_md or "No run has logged reward_100 yet (no game has ended).", ""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


# -- command line -------------------------------------------------------------------------------


def _share(value: str) -> float:
    """argparse type: a finite number >= 0 (a share of GPUs)."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}")
    if not 0 <= x < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return x


def make_parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="dqn-sweep",
        usage="%(prog)s --stages LIST [options] [-- STAGE FLAGS]",
        description=__doc__.split("\n\n")[0],
        epilog="Stage flags after a lone -- go to every run (-- --replay-initial 1000); a stage's own knob "
        "(--steps, --envs) only to the stages that have it.",
    )
    p.add_argument("--stages", required=True, help="comma-separated stages, e.g. 05,06,07")
    p.add_argument("--seeds", default="0", help="seeds: N, A-B or a comma list (default 0)")
    p.add_argument("--games", default="pong", help=f"comma-separated games: {', '.join(GAMES)} (default pong)")
    p.add_argument("--max-frames", type=cli.positive, help="agent steps per run (default: until solved)")
    p.add_argument("--per-run-cpus", type=cli.positive_float, default=2.0, help="CPUs a run takes (default 2)")
    p.add_argument(
        "--per-run-gpus",
        type=_share,
        default=None,
        help="GPUs a run takes; below 1 several runs share a GPU (default 1 where there are GPUs, else 0)",
    )
    p.add_argument(
        "--address", metavar="HOST:PORT", help="HOST:PORT of an existing Ray cluster's head (default: this machine)"
    )
    p.add_argument("--out", default=os.path.join("runs", "sweep"), help="the sweep's folder (default runs/sweep)")
    p.add_argument(
        "--save-every",
        type=cli.positive,
        default=SAVE_EVERY,
        help=f"agent steps between a run's checkpoints (default {SAVE_EVERY})",
    )
    p.add_argument("--progress", type=cli.positive_float, default=PROGRESS_SEC, metavar="SEC",
                   help=f"seconds between progress lines (default {PROGRESS_SEC:g})")  # fmt: skip
    return p


def parse_args(argv: list[str]):
    """Sweep flags before a lone ``--``, stage flags after it."""
    if "--" in argv:
        cut = argv.index("--")
        argv, flags = argv[:cut], argv[cut + 1 :]
    else:
        flags = []
    args = make_parser().parse_args(argv)
    if args.per_run_gpus is not None and args.per_run_gpus > 1 and args.per_run_gpus != int(args.per_run_gpus):
        raise UsageError(f"--per-run-gpus {args.per_run_gpus:g}: above 1, a run takes whole GPUs")
    args.flags = flags
    return args


def _check_out(out: str) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out}: is a file")
    cli.check_writable_dir(out, "--out")


def _on_sigterm(signum, frame):
    raise Terminated()


def _make_pool(args):
    """Where the runs go, checked against what it offers (UsageError)."""
    if args.address:
        pool = RayPool(args.address, args.per_run_cpus, args.per_run_gpus)
        pool.connect()
    else:
        pool = LocalPool(args.per_run_cpus, args.per_run_gpus, os.path.join(args.out, ".work"))
        pool.check()
    return pool


def _grid(specs: list[RunSpec], args) -> tuple[dict, str]:
    """The grid as sweep.json records it, and its size in words."""
    stages = sorted({s.stage for s in specs})
    seeds = sorted({s.seed for s in specs})
    games = sorted({s.game for s in specs}, key=list(GAMES).index)
    grid = {"stages": ",".join(stages), "seeds": _seed_text(seeds), "games": ",".join(games),
            "max_frames": args.max_frames, "flags": args.flags}  # fmt: skip
    return grid, f"{len(stages)} stages x {len(seeds)} seeds x {len(games)} games"


def _skip_finished(sweep: Sweep, jobs: list[Job]) -> int:
    """Mark the runs an earlier invocation finished; how many."""
    for job in jobs:
        if run_complete(sweep.folder(job), job.spec.max_frames):
            job.status = "skipped"
            job.frame = (_read_summary(sweep.folder(job)) or {}).get("frames", 0)
    return sum(j.status == "skipped" for j in jobs)


def _drive(sweep: Sweep, pool, out: str) -> tuple[int, str]:
    """Run the sweep to its end or until Ctrl-C or SIGTERM (a second one kills the runs at once);
    the exit code and the outcome in words."""
    code, outcome = 0, "complete"
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            sweep.run()
        except (KeyboardInterrupt, Terminated) as e:
            code = EXIT_SIGINT if isinstance(e, KeyboardInterrupt) else EXIT_SIGTERM
            outcome = "interrupted"
            sweep.stop(code)
    except (KeyboardInterrupt, Terminated):  # a second one: no more waiting
        sweep.kill()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pool.close()
        shutil.rmtree(os.path.join(out, ".work"), ignore_errors=True)
    return code, outcome


def _main(argv: list[str]) -> int:
    args = parse_args(argv)
    specs = plan(args)
    _check_out(args.out)
    pool = _make_pool(args)
    # The share asked may have been "auto": every run gets the one resolved.
    specs = [dataclasses.replace(s, gpus=pool.gpus) for s in specs]
    grid, size = _grid(specs, args)

    # Input is good: from here on, things are made.
    started = time.monotonic()
    date = datetime.datetime.now().isoformat(timespec="seconds")
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    shutil.rmtree(os.path.join(args.out, ".work"), ignore_errors=True)  # left by a killed driver
    jobs = [Job(s) for s in specs]
    sweep = Sweep(jobs, args.out, pool, args.progress)
    skipped = _skip_finished(sweep, jobs)
    print(f"sweep: {len(jobs)} runs ({size}), {skipped} finished before, {len(jobs) - skipped} to run; "
          f"{pool.describe()}", flush=True)  # fmt: skip

    code, outcome = _drive(sweep, pool, args.out)
    if code == 0 and any(j.status == "failed" for j in jobs):
        code, outcome = EXIT_FAILED, "runs failed"
    meta = {
        "command": machine.command_line(argv, "dqn-sweep", "lib.sweep"), "commit": cli.git_commit(ROOT), "date": date,
        "wall_s": round(time.monotonic() - started, 1), "where": pool.describe(), "outcome": outcome, "grid": grid,
    }  # fmt: skip
    write_report(args.out, sweep, meta)
    print(sweep.progress_line().split("; ETA")[0], flush=True)
    print(f"sweep: wrote {os.path.join(args.out, 'README.md')}", flush=True)
    return code


def _seed_text(seeds: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    parts, start = [], None
    for i, s in enumerate(seeds):
        if start is None:
            start = s
        if i + 1 == len(seeds) or seeds[i + 1] != s + 1:
            parts.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ",".join(parts)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except UsageError as e:
        return cli.usage_exit("sweep", e)
