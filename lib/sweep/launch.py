"""One run of a sweep, the same code on this machine and on a Ray node: the stage script in a
process group of its own, its output and checkpoints followed, its files brought back as bytes
(its replay rings, on this machine, as hard links: ``rings``).

``execute`` starts the stage exactly as a user would (same script, same flags), in a fresh
folder, and yields what happens; however it ends, nothing of the run's process group outlives
it and the folder is removed. A launcher asks Linux to SIGTERM the stage when the thread that
started it goes, so a killed driver, Ray worker or node leaves no stage behind.
"""

from __future__ import annotations

import codecs
import glob
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from lib.run import procs
from lib.run.stages import ROOT, STAGES
from lib.sweep import rings
from lib.sweep.grid import RunSpec

STOP_GRACE = 15.0  # seconds a stopped run gets to write its checkpoint and summary before SIGKILL
# A run's folder: what comes back at the end (and, while it runs, each time it saves a checkpoint).
FILE_PATTERNS = ("summary.json", "events.out.tfevents.*", "checkpoint.pt", "best.pt", "model.pt")
LIVE_PATTERNS = ("checkpoint.pt", "events.out.tfevents.*")

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


def _end_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the run's process group (the stage saves a checkpoint and its summary), SIGKILL
    it after ``grace`` seconds, reap it. Helpers still alive after the stage exited are killed."""
    procs.end_group(proc, terminate=True, grace=grace)
    proc.stdout.close()


def collect(folder: str | None, patterns=FILE_PATTERNS) -> dict[str, bytes]:
    """The files of a run folder that match ``patterns``, name -> bytes (none while the folder is unknown)."""
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
    """The stage's environment: as many threads as its CPUs, and only the GPUs it was given."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    threads = str(max(1, int(spec.cpus)))
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)  # none asked: none seen
    return env


def _prepare(spec: RunSpec, work: str, resume: dict | None) -> tuple[list[str], str | None]:
    """The stage's arguments, and the run folder when it is known before the stage starts: a
    resumed run continues in a folder holding the earlier attempt's files."""
    argv = spec.argv()
    if not resume:
        return argv + ["--run-dir", work], None
    folder = os.path.join(work, spec.key)
    os.makedirs(folder)
    for name, data in resume.items():
        rings.place(data, os.path.join(folder, name))  # bytes, or the ring linked
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


def _saved(folder: str, keep: str | None) -> dict[str, bytes]:
    """The checkpoint and event files of the stage's folder, with ``keep`` (a folder of this
    machine) holding the ring that checkpoint names: the stage writes a ring before its
    checkpoint and removes the old one after it, so rings linked while the checkpoint stayed the
    same include its own."""
    ckpt = os.path.join(folder, "checkpoint.pt")
    while True:
        before = _stamp(ckpt)
        files = collect(folder, LIVE_PATTERNS)
        if keep is None:
            return files
        rings.keep_rings(folder, keep)
        if _stamp(ckpt) == before:
            return files


def _stamp(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _follow(proc: subprocess.Popen, work: str, folder: str | None, stop, kill, poll: float, keep: str | None = None):
    """Yield the stage's output (``log``) and, each time it saves a checkpoint, its checkpoint
    and event files (``files``; its rings linked into ``keep``) until it exits; return its run
    folder. ``stop``: SIGTERM its group, SIGKILL after STOP_GRACE seconds; ``kill``: SIGKILL at once."""
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
                yield "files", _saved(folder, keep)
        if stop is not None and stop.is_set() and not stopping:
            stopping, kill_at = True, time.monotonic() + STOP_GRACE
            procs.signal_group(proc.pid, signal.SIGTERM)
        if (kill_at is not None and time.monotonic() > kill_at) or (kill is not None and kill.is_set()):
            procs.signal_group(proc.pid, signal.SIGKILL)
            kill_at, kill = None, None
        if procs.leader_exited(proc.pid):
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
    spec: RunSpec, parent: str, resume: dict | None = None, gpu_ids=(), stop=None, kill=None, poll=1.0, keep=None
):
    """Run one stage process in a fresh folder under ``parent`` and yield what happens, as
    ``(kind, payload)``: ``start`` (host, pid, command), ``log`` (new output), ``files`` (the
    checkpoint and event files, each time the stage saves a checkpoint) and last ``end``
    (exit code and the run folder's files). ``resume``: files of an earlier attempt (its
    checkpoint and event files as bytes, its ring as ``rings.Linked``) to continue from.
    ``keep``: a folder of this machine where the stage's rings are hard-linked as it writes
    them (None: they go with the folder). ``stop`` (a threading.Event) asks the run to
    end as Ctrl-C would (SIGTERM, SIGKILL after STOP_GRACE seconds); ``kill``, at once. However
    the generator ends (closed, cancelled, an error), nothing of the process group outlives it
    and the folder is removed."""
    script = STAGES[spec.stage].path
    work = _workdir(parent, spec.key)
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
        folder = yield from _follow(proc, work, folder, stop, kill, poll, keep)
        _end_group(proc, grace=0.0)  # the stage is gone: only stragglers of its group are killed
        code = proc.returncode
        proc = None
        if keep is not None and folder is not None:
            rings.keep_rings(folder, keep)
        yield "end", {"code": code, "files": collect(folder)}
    finally:
        if proc is not None:
            _end_group(proc, grace=STOP_GRACE)
        shutil.rmtree(work, ignore_errors=True)


def _workdir(parent: str, key: str) -> str:
    """A fresh folder under ``parent``, made again where another run's end removed an empty
    ``parent`` meanwhile (``ray_pool``)."""
    while True:
        os.makedirs(parent, exist_ok=True)
        try:
            return tempfile.mkdtemp(prefix=f"{key}-p{os.getpid()}-", dir=parent)
        except FileNotFoundError:
            continue


def clear_stale(parent: str) -> None:
    """Remove the folders of runs whose follower process is gone: a worker that died with its
    node never removed its own."""
    for path in glob.glob(os.path.join(parent, "*-p*-*")):
        m = re.search(r"-p(\d+)-[^-]*$", path)
        if not m:
            continue
        if not procs.alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
