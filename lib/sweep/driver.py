"""The driver of a sweep, the same for both pools: ``Sweep`` starts the runs of the grid through
a pool (``LocalPool`` or ``RayPool``), files what comes back in the run's folder, retries a run
whose process or node died once, from the last checkpoint it received, and stops every run on
Ctrl-C or SIGTERM.

A pool offers ``can_start()``, ``start(token, spec, resume, keep)``, ``poll(timeout)`` (a list of
``(token, kind, payload)``, the kinds of ``launch.execute`` plus ``died``), ``stop()``,
``kill()``, ``close()`` and ``describe()``.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import os
import re
import signal
import time

from lib.run.checkpoint import atomic_write
from lib.run.cli import EXIT_USAGE, EXIT_WRITE
from lib.sweep import report, rings
from lib.sweep.grid import ACTIVE, Job, dead_layer, read_summary, run_complete
from lib.sweep.launch import LIVE_PATTERNS, STOP_GRACE, collect

ATTEMPTS = 2  # a run that dies is started once more, then reported failed
LOG = "run.log"


def _store(folder: str, files: dict[str, bytes]) -> None:
    """Files that came back from a run, each written whole or not at all."""
    for name, data in files.items():
        atomic_write(os.path.join(folder, name), lambda f, data=data: f.write(data))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Sweep:
    """Starts, follows and files the runs of a grid through a pool (LocalPool or RayPool)."""

    def __init__(self, jobs: list[Job], out: str, pool, progress: float, log=None):
        self.jobs = {j.spec.key: j for j in jobs}
        self.carried: dict[str, Job] = {}  # the folder's runs outside this grid: reported, never started
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
            resume = collect(folder, LIVE_PATTERNS)
        else:  # a fresh start: files of an earlier attempt would mix into its curve
            for name in os.listdir(folder):
                if name != LOG:
                    os.remove(os.path.join(folder, name))
        spec = self._ring(job, folder, resume)
        job.attempts += 1
        job.status, job.token, job.partial = "waiting", self.next_token, ""
        job.host = job.node = job.pid = job.last_progress = None
        self.by_token[self.next_token] = job
        self.next_token += 1
        how = "from its checkpoint" if resume else "from the start"
        with open(os.path.join(folder, LOG), "a") as f:
            f.write(
                f"== attempt {job.earlier + job.attempts}, {how}, {datetime.datetime.now().isoformat(timespec='seconds')}\n"
            )
        self.pool.start(job.token, spec, resume, folder if spec.save_replay else None)

    def _ring(self, job: Job, folder: str, resume: dict | None):
        """The run's spec for this attempt, with its ring where the sweep keeps rings and the
        disk has room (one line where it has not), and ``resume`` (changed in place) with the
        ring its checkpoint names, or the checkpoint stripped of it where the run goes without."""
        spec, job.ringless = job.spec, None
        named = rings.named_ring(folder)[1] if resume else None
        if spec.save_replay:
            others = [j for j in self.active() if j is not job and j.spec.save_replay and j.ringless is None]
            need = rings.need_for(spec, folder) + sum(rings.need_for(j.spec, self.folder(j)) for j in others)
            fits, free = rings.room(self.out, need)
            if not fits:
                job.ringless = (f"no room for its replay ring: {rings.size(need)} and a margin of "
                                f"{rings.size(rings.MARGIN)} needed, {rings.size(free)} free")  # fmt: skip
            elif named and not os.path.isfile(os.path.join(folder, named)):
                job.ringless = f"its replay ring {named} is missing"
            if job.ringless:
                self.log(
                    f"run {job.spec.key}: {job.ringless}; it goes without" + (" (its buffer refilled)" if named else "")
                )
                spec = dataclasses.replace(spec, save_replay=False)
        if named and spec.save_replay:
            resume[named] = rings.Linked(os.path.join(folder, named))
        elif named:
            resume["checkpoint.pt"] = rings.without_ring(resume["checkpoint.pt"])
        return spec

    def _handle(self, token, kind: str, payload) -> None:
        job = self.by_token.get(token)
        if job is None or job.token != token:
            return  # an earlier attempt's last words
        folder = self.folder(job)
        if kind == "start":
            job.status = "running"
            job.host, job.node, job.pid = payload["host"], payload.get("node"), payload["pid"]
            where = f"{job.host}" + (f" node {job.node}" if job.node else "")
            self.log(f"run {job.spec.key}: started (attempt {job.earlier + job.attempts}) on {where}, pid {job.pid}")
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
            rings.prune(folder)
        elif kind == "end":
            _store(folder, payload["files"])
            rings.prune(folder)
            self._ended(job, payload["code"], None)
        elif kind == "died":
            self._ended(job, None, payload)

    def _ended(self, job: Job, code: int | None, died: str | None) -> None:
        job.token = None
        key, folder = job.spec.key, self.folder(job)
        summary = (read_summary(folder) if code is not None else None) or {}
        if summary:
            job.frame = summary.get("frames") or job.frame
        if code == 0 and run_complete(folder, job.spec.max_frames):
            job.status, job.reason = "done", None
            if summary.get("solved"):
                rings.prune(folder, everything=True)  # a solved run never resumes
            seconds = summary.get("run_seconds") or summary.get("seconds")
            took = f", {seconds / 60:.1f} min" if seconds else ""
            dead = dead_layer(summary)
            ended = f", ended: no unit of {dead['layer']} active since frame {dead['frame']}" if dead else ""
            self.log(f"run {key}: done, {job.frame} frames{took}" + (", solved" if summary.get("solved") else ended))
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
        elif code == EXIT_WRITE:  # a file could not be written (disk full): another try would fail too
            job.status, job.reason = "failed", f"a file of the run could not be written ({self._last_line(job)})"
        elif job.attempts < ATTEMPTS:
            ckpt = os.path.exists(os.path.join(folder, "checkpoint.pt"))
            self.log(f"run {key}: {reason}; retrying " + ("from its last checkpoint" if ckpt else "from the start"))
            job.status = "queued"
            self.queue.appendleft(job)
            return
        else:
            job.status, job.reason = "failed", reason
        self.log(f"run {key}: FAILED ({job.reason}); log: {os.path.join(folder, LOG)}")
        for line in self.tail(job, 5):
            self.log(f"    {line}")

    def tail(self, job: Job, n: int) -> list[str]:
        """The last ``n`` lines the run's stage wrote (its log, less the sweep's own lines)."""
        try:
            with open(os.path.join(self.folder(job), LOG), errors="replace") as f:
                lines = [line.rstrip() for line in f if line.strip() and not line.startswith("==")]
            return lines[-n:]
        except OSError:
            return []

    def _last_line(self, job: Job) -> str:
        tail = self.tail(job, 1)
        return tail[0] if tail else "no output"

    # -- the loop --------------------------------------------------------------------------
    def active(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.status in ACTIVE]

    def run(self, received: list | None = None) -> None:
        """Until every run has ended, or a stop signal is in ``received`` (``record_stops``)."""
        received = [] if received is None else received
        for job in self.jobs.values():
            if job.status == "queued":
                self.queue.append(job)
        next_line = time.monotonic() + self.progress
        while (self.queue or self.active()) and not received:
            while self.queue and self.stopping is None and self.pool.can_start():
                self._launch(self.queue.popleft())
            for token, kind, payload in self.pool.poll(timeout=1.0):
                self._handle(token, kind, payload)
            if self.stopping is not None and not self.active():
                break
            if time.monotonic() >= next_line:
                next_line += self.progress
                self.log(report.progress_line(self))

    def stop(self, code: int, received: list | None = None) -> None:
        """Ctrl-C, SIGTERM or SIGHUP: every running run is asked to end; their files still come
        back. A second signal in ``received`` kills them at once."""
        received = [] if received is None else received
        self.stopping, signalled = code, len(received)
        self.log(f"sweep: stopping {len(self.active())} runs")
        self.pool.stop()
        deadline = time.monotonic() + STOP_GRACE + 15
        while self.active() and time.monotonic() < deadline:
            if len(received) > signalled:
                self.kill()
                return
            for token, kind, payload in self.pool.poll(timeout=0.5):
                self._handle(token, kind, payload)
        for job in self.active():
            job.status, job.reason = "interrupted", "did not answer the stop"

    def kill(self) -> None:
        self.pool.kill()
        for job in self.active():
            job.status, job.reason = "interrupted", "killed"
