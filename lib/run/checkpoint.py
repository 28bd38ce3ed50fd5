"""The files a run writes to be resumed or played, and how: their kinds, what goes in each,
how they are written (whole or not at all) and read back.

- ``checkpoint.pt`` (kind ``CHECKPOINT_KIND``): what the run goes on from (``checkpoint_state``
  lists it): the stage, game, hyperparameters and knobs, the agent-step counter, the run's
  time so far, the reward history, the global RNG states, and the state of each object the
  run saves (net, target net, optimizer).
- ``replay-<frame>.pt`` (``--save-replay``): the replay ring's ``state_dict``, named in the
  checkpoint with the ring's capacity and number of rings.
- ``best.pt``, ``model.pt`` (kind ``MODEL_KIND``): the net in fp32 on the CPU, with what
  ``lib.analysis.watch`` needs to play it (env id, wrapper set).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import os
import re
import secrets
import stat

import torch

from lib.analysis.run_folders import RESUME_TAG
from lib.run import disk, game_state, procs, resume, ring_files, signals
from lib.run.cli import DeviceError, UsageError, WriteError
from lib.run.runtime import rng_state, set_rng_state
from lib.schedules import epsilon_at

CHECKPOINT_KIND = "dqn-speedup-checkpoint"
MODEL_KIND = "dqn-speedup-model"


_open = open  # the one way files of a run are opened for writing (tests put a failing disk here)


def atomic_write(path: str, write) -> None:
    """``write(f)`` into a temporary file beside ``path`` (a binary file, its name unique to
    this write: ``path.<pid>.<random>.tmp``), then rename it to ``path``: a crash, a full disk
    or a second writer never leaves a broken file under the real name. SIGINT, SIGTERM and
    SIGHUP wait until the file is whole (``signals.held``). However the write ends, the
    temporary file does not outlive it; a failure is WriteError naming the file and the reason."""
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with signals.held():
            try:
                with _open(tmp, "wb") as f:
                    write(f)
                os.replace(tmp, path)
            except (OSError, RuntimeError) as e:  # torch.save reports a failed write as RuntimeError
                raise WriteError(f"cannot write {path}: {disk.write_reason(e, tmp)}") from None
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)


def read_file(path: str, label: str, what: str):
    """A file of this project read onto the CPU (tensors and plain data only); UsageError,
    starting with ``label``, where it is missing or not readable as ``what``."""
    if not os.path.isfile(path):
        raise UsageError(f"{label}: {what_is(path)}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"{label}: not a readable {what} ({type(e).__name__})")


def what_is(path: str) -> str:
    """What is at ``path``, which is not a regular file: the words after its name."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a loop of symbolic links, not a file"
        return "no such file" if e.errno == errno.ENOENT else f"cannot be read ({e.strerror})"
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))  # fmt: skip
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"{kind}, not a file"


def load_checkpoint(path: str) -> dict:
    ckpt = read_file(path, f"--resume {path}", "checkpoint")
    if not isinstance(ckpt, dict) or ckpt.get("kind") != CHECKPOINT_KIND:
        raise UsageError(f"--resume {path}: not a dqn-speedup checkpoint")
    resume.check_checkpoint(ckpt, path)
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


RESUMED_PARAMS = ("replay_size", "replay_initial")  # hyperparameters a resume may be given again


def resume_settings(ckpt: dict | None, args, given: set, knobs) -> dict:
    """A resume goes on with its checkpoint's seed and knobs (``args`` changed in place): another
    ``--seed`` is refused (UsageError; the seed is part of what a checkpoint belongs to, and a
    curve of seed 0 must not be filed as seed 7's); a knob (``knobs``: the stage's) or replay
    size given again with another value is taken, and returned as {name: (saved, given)}.
    A checkpoint from before checkpoints held the seed takes the one given."""
    if ckpt is None:
        return {}
    seed = ckpt.get("seed")
    if seed is not None and "--seed" in given and args.seed != seed:
        raise UsageError(
            f"--resume {args.resume}: the checkpoint is of seed {seed}, not {args.seed} (a run goes on with its seed)"
        )
    args.seed = seed if seed is not None else args.seed
    changed = {}
    for knob, value in ckpt.get("knobs", {}).items():
        if knob not in knobs:
            continue
        if f"--{knob}" not in given:
            setattr(args, knob, value)
        elif getattr(args, knob) != value:
            changed[knob] = (value, getattr(args, knob))
    for name in RESUMED_PARAMS:
        saved, now = ckpt["params"].get(name), getattr(args, name)
        if now is not None and saved is not None and now != saved:
            changed[name] = (saved, now)
    return changed


def checkpoint_state(run) -> dict:
    """What ``checkpoint.pt`` holds for ``run`` (a ``lib.run.runner.Run``), less the replay ring."""
    state = {
        "kind": CHECKPOINT_KIND,
        "stage": run.stage,
        "game": run.game,
        "seed": run.args.seed,
        "wrappers": run.wrappers,
        "params": dataclasses.asdict(run.params),
        "frame_idx": run.frame_idx,
        "run_seconds": run.run_seconds(),
        "resumes": run.resumes,  # every resume so far (``lib.run.resume.record``)
        "save_every": run.args.save_every,
        "epsilon": epsilon_at(run.frame_idx, run.params),
        "rewards": list(run.tracker.rewards),
        "best_mean": run.tracker.best_mean,
        "rng": rng_state(),
        "tracker": run.tracker.state_dict(),
        "units": run.probes["dead_units"].check.state_dict(),
        "knobs": dict(run.saved_knobs),
        "belongs": resume.belongs(run.stage, run.game, run.params, run.args.envs),
    }
    for name, obj in run.saveables.items():
        state[name] = obj.state_dict()
    return state


def write_checkpoint(run) -> str:
    """``checkpoint.pt`` in the run's folder, and with ``--save-replay`` the ring's file and the
    game in progress; the checkpoint's path. Replay files of earlier checkpoints are removed.
    A stop signal waits until both are written."""
    with signals.held():
        return _write_checkpoint(run)


def _write_checkpoint(run) -> str:
    state = checkpoint_state(run)
    old_replays = glob.glob(os.path.join(run.folder, "replay-*.pt"))
    path = os.path.join(run.folder, "checkpoint.pt")
    if run.args.save_replay and run.buffer is not None:
        # The ring goes in a file of its own, named by frame and written first: a crash between
        # the two writes leaves the previous pair whole (and a ring no checkpoint names, which
        # the next resume removes). The disk must have room for both before the ring is written.
        name = f"replay-{run.frame_idx}.pt"
        ring = os.path.join(run.folder, name)
        info = resume.ring_belongs(run.stage, run.game, run.params, run.args.envs, run.frame_idx)
        ckpt_bytes = ring_files.nbytes(state)
        try:
            atomic_write(ring, lambda f: ring_files.save_ring(run.buffer, info, f, then=ckpt_bytes))
        except WriteError:
            if not os.path.exists(path):  # the first save: a checkpoint without its ring still resumes
                with contextlib.suppress(WriteError):
                    atomic_write(path, lambda f: torch.save(state, f))
            raise
        state["replay"] = {"file": name, **info}
        if run.env is not None:
            state["env"] = game_state.env_state(run.env)
        try:
            atomic_write(path, lambda f: torch.save(state, f))
        except WriteError:
            if ring not in old_replays:  # no checkpoint names it: it would only keep the disk full
                with contextlib.suppress(OSError):
                    os.remove(ring)
            raise
    else:
        atomic_write(path, lambda f: torch.save(state, f))
    for old in old_replays:
        if os.path.basename(old) != state.get("replay", {}).get("file"):
            os.remove(old)
    return path


_TMP = re.compile(r"\.(\d+)\.[0-9a-f]{8}\.tmp$")  # atomic_write's temporary files: <name>.<pid>.<random>.tmp
_RING = re.compile(r"^replay-\d+\.pt$")


def clear_leftovers(folder: str, resumed: str, ckpt: dict) -> list[str]:
    """Remove from the run folder ``folder`` what writers that died there left: rings that no
    checkpoint names (neither ``ckpt``, resumed from ``resumed``, nor the folder's checkpoint.pt;
    a crash between a ring and its checkpoint leaves one, as large as the buffer) and temporary
    files of processes no longer alive (a SIGKILL mid-write). Called with the folder held
    (``lib.run.runlock``), before the run's first write; returns the names removed."""
    named = {ckpt.get("replay", {}).get("file")}
    own = os.path.join(folder, "checkpoint.pt")
    if os.path.isfile(own) and not os.path.samefile(own, resumed):
        try:  # mapped, not read: only the name of its ring is wanted
            other = torch.load(own, map_location="cpu", weights_only=True, mmap=True)
            named.add(other.get("replay", {}).get("file"))
        except Exception:
            named = None  # which ring it names is not known: every ring stays
    removed = []
    for entry in os.scandir(folder):
        tmp = _TMP.search(entry.name)
        if tmp:
            pid = int(tmp.group(1))
            stale = pid == os.getpid() or not procs.alive(pid)  # this process writes nothing yet
        else:
            stale = named is not None and _RING.match(entry.name) is not None and entry.name not in named
        if stale:
            with contextlib.suppress(OSError):
                os.remove(entry.path)
                removed.append(entry.name)
    return sorted(removed)


def host_weights(net) -> dict:
    """``net``'s weights read back to the host, fp32; a device that failed raises ``DeviceError``."""
    try:
        return {k: v.detach().float().cpu() if v.is_floating_point() else v.cpu() for k, v in net.state_dict().items()}
    except RuntimeError as e:
        raise DeviceError.of(e) from None


def write_model(run, name: str) -> str:
    """The run's net as ``name`` (best.pt, model.pt) in its folder, fp32 on the CPU; the path."""
    state = host_weights(run.saveables["net"])
    payload = {
        "kind": MODEL_KIND,
        "stage": run.stage,
        "game": run.game,
        "env_name": run.params.env_name,
        "wrappers": run.wrappers,
        "frame_idx": run.frame_idx,
        "mean_reward": run.tracker.mean_reward,
        "net": state,
    }
    path = os.path.join(run.folder, name)
    atomic_write(path, lambda f: torch.save(payload, f))
    return path


def restore(ckpt: dict, objects: dict, tracker, buffer, replay: dict | None, stage: str) -> str:
    """A resumed run's state from its checkpoint: each of ``objects`` (net, tgt_net, optimizer),
    the global RNGs, the tracker's losses, and, when the checkpoint holds one, the replay ring
    (``replay``: as ``resume.open_ring`` read it) in ``stage``'s form. Returns what the ring's
    load says of a conversion ("" where none). The run's events record the resume: ``resume_ring``
    at the checkpoint's frame, 1 where the ring comes back, 0 where the buffer is refilled."""
    for name, obj in objects.items():
        load_state(obj, ckpt[name])
    set_rng_state(ckpt["rng"])
    tracker.load_state_dict(ckpt["tracker"])
    if tracker.writer is not None:
        tracker.writer.add_scalar(RESUME_TAG, float(replay is not None), ckpt["frame_idx"])
    if replay is None:
        return ""
    return ring_files.load_ring(buffer, replay, stage, ckpt)
