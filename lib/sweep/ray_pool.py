"""The Ray pool: the runs of a sweep as Ray tasks on an existing cluster (``--address``); Ray
queues what does not fit yet. Each task runs ``launch.execute`` on its node and streams what
happens back to the driver, files as bytes: nothing is shared but Ray's object store.

Ray is optional (``pip install -e ".[cluster]"``): it is imported only where a sweep uses a
cluster, so a sweep on this machine runs without it.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import tempfile
import threading
import time

from lib.run.cli import EXIT_USAGE, UsageError
from lib.sweep.grid import RunSpec
from lib.sweep.launch import clear_stale, execute


def _ray_attempt(spec: RunSpec, resume: dict[str, bytes] | None):
    """The Ray task: ``execute`` on whichever node Ray chose, in that node's temp folder. Ray
    ships it to the nodes by its module's name, so it lives here and never in ``__main__``."""
    import ray  # ray is optional (the "cluster" extra): imported only where a sweep uses it

    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    node = ray.get_runtime_context().get_node_id()
    parent = os.path.join(tempfile.gettempdir(), "dqn-sweep")
    clear_stale(parent)
    try:
        for kind, payload in execute(spec, parent, resume, gpu_ids):
            if kind == "start":
                payload["node"] = node
            yield kind, payload
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(parent)  # the staging folder goes with the node's last run (another's keeps it)


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


@contextlib.contextmanager
def _quiet_fds():
    """Within: file descriptors 1 and 2 point at /dev/null (what Ray's C++ code writes there
    goes); yields a descriptor of the real stderr, for a line that must still be seen."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in saved:
            os.dup2(devnull, fd)
        yield saved[2]
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


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
        # A port that answers but is not Ray's: ray.init would keep trying, and Ray's C++ core
        # would write its warnings straight to the file descriptors: they go to /dev/null.
        with _quiet_fds() as stderr:
            watchdog = threading.Timer(60.0, self._no_answer, args=(stderr,))
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

    def _no_answer(self, stderr: int) -> None:
        os.write(stderr, f"sweep: error: --address {self.address}: no Ray cluster answered within 60 s\n".encode())
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

    def start(self, token, spec: RunSpec, resume, keep: str | None = None) -> None:
        """Start a run as a task; its rings stay on its node (``keep`` is not reachable there)."""
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
            self.ray.cancel(gen, force=True)  # the worker dies; its stage gets SIGTERM (see launch.py)

    def close(self) -> None:
        self.ray.shutdown()


def _ray_reason(e: Exception) -> str:
    name = type(e).__name__
    if "TaskCancelled" in name or "TaskCancelled" in str(e)[:300]:
        return "cancelled"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{name}: {first}"[:300]
