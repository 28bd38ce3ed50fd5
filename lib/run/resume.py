"""The resume rules: what a checkpoint and a replay file belong to, and whether the stage that
resumes them can take them: checked before a run creates anything, refused in one line naming what differs.

What belongs to what:

- A checkpoint (``belongs``): the stage that saved it, the frames its stage plays (``old`` or
  ``new`` wrapper set, or ale-py's ``vector`` env), the layout of its replay ring, the game and
  env id, and the ring's size. A checkpoint without ``belongs`` is described from the fields it
  has (``stage``, ``wrappers``, ``params``, ``knobs``, ``replay``).
- A replay file (``replay-<frame>.pt``, with ``--save-replay``): its ring's state with the same
  description under ``belongs``, plus the frame it was saved at. A replay file without it is read
  from its own keys and from the checkpoint that names it.

Ring layouts: ``ring`` (one ring in host memory, ``ReplayBuffer``: stages 01-06), ``rings`` (one
ring per game in host memory, ``StreamReplayBuffer``: stage 07) and ``device`` (the same rings
end to end in one tensor on the training device, ``DeviceReplayBuffer``: stage 08).

The rules, for ``--resume``:

- The net, target net, optimizer, RNG and scores of any stage's checkpoint resume in any stage:
  every stage trains the same Nature DQN (the bench resumes every stage from one checkpoint).
  The checkpoint's game and env id stay: ``--game`` or ``--env`` naming others is refused.
- A ring resumes only in a stage whose frames come from the same preprocessing: 01-04 (old
  wrapper set), 05-06 (new wrapper set), 07-08 (ale-py's vector env). Frames of one set in a
  ring of another would mix two preprocessings in one batch, so that is refused, naming the
  stages that can take it. Its size and ring count must be the stage's (``--replay-size``,
  ``--envs``).
- Stage 07's rings and stage 08's hold the same contents, ring for ring: the frames, actions,
  rewards and flags of each slot, each ring's cursor, slots written, transitions, pad slots and
  open episode. Only the form differs (a list of rings against one flat tensor with per-ring
  arrays), so a ring of either is converted into the other's form on resume. What is not
  carried over is how a batch is drawn: 07 draws from its own numpy generators, 08 from
  torch's (which the checkpoint restores), so the batches after the resume differ from those
  the other stage would have drawn, as they would between the two stages anyway.
- A stage that plays in its own process (01, 02) and resumes a ring whose game in progress was
  not saved (a ring of 03-06) starts a new game: the ring's open episode is closed first, so
  that no transition joins the old game to the new one.

A replay file that is missing, cut short or not a ring is refused like a corrupt checkpoint.

What a resume records (``record``): one entry per resume, in order, kept in each checkpoint
(``resumes``) and in summary.json, and one line in the run folder's run.log.
"""

from __future__ import annotations

import datetime
import os

from lib.params import FRAME_SHAPE, STACK  # every stage's frames: a stack of 4 frames of 84x84
from lib.run.cli import UsageError, WriteError
from lib.run.stages import STAGES

FRAMES = {"old": "the old wrapper set", "new": "the new OpenCV wrapper set", "vector": "ale-py's vector env"}
LAYOUTS = {"ring": "ReplayBuffer", "rings": "StreamReplayBuffer", "device": "DeviceReplayBuffer"}
# What every checkpoint holds and a resume reads: missing, the checkpoint is not one a stage can go on from.
CHECKPOINT_FIELDS = ("stage", "game", "params", "frame_idx", "rewards", "rng", "tracker", "net", "tgt_net", "optimizer")


def ring_layout(stage: str) -> str:
    """The replay ring's layout in ``stage``: ``ring``, ``rings`` or ``device``."""
    s = STAGES[stage]
    if s.sampling == "device":
        return "device"
    return "rings" if s.play == "vector" else "ring"


def belongs(stage: str, game: str, params, streams: int) -> dict:
    """What a checkpoint of ``stage`` belongs to, as it saves it."""
    return {
        "stage": stage,
        "wrappers": STAGES[stage].wrappers,
        "layout": ring_layout(stage),
        "game": game,
        "env": params.env_name,
        "capacity": params.replay_size,
        "streams": streams if ring_layout(stage) != "ring" else 1,
        "stack": STACK,
        "frame_shape": list(FRAME_SHAPE),
    }


def ring_belongs(stage: str, game: str, params, streams: int, frame_idx: int) -> dict:
    """What a replay file of ``stage`` at ``frame_idx`` belongs to (saved in it and in its checkpoint)."""
    return {**belongs(stage, game, params, streams), "frame_idx": frame_idx}


def describe_checkpoint(ckpt: dict) -> dict:
    """``belongs`` of a checkpoint, inferred from its other fields where it predates the entry."""
    if isinstance(ckpt.get("belongs"), dict):
        return ckpt["belongs"]
    stage = str(ckpt["stage"])
    replay = ckpt.get("replay") or {}
    params = ckpt["params"]
    return {
        "stage": stage,
        "wrappers": ckpt.get("wrappers") or (STAGES[stage].wrappers if stage in STAGES else None),
        "layout": ring_layout(stage) if stage in STAGES else None,
        "game": ckpt["game"],
        "env": params.get("env_name"),
        "capacity": replay.get("capacity", params.get("replay_size")),
        "streams": replay.get("streams", (ckpt.get("knobs") or {}).get("envs", 1)),
        "stack": STACK,
        "frame_shape": list(FRAME_SHAPE),
    }


# -- checkpoints -------------------------------------------------------------------------------


def check_checkpoint(ckpt: dict, path: str) -> None:
    """UsageError unless ``ckpt`` (a dqn-speedup checkpoint) has every field a resume reads and
    holds the Nature DQN of stacked 84x84 frames."""
    from lib.params import Hyperparams

    missing = [name for name in CHECKPOINT_FIELDS if name not in ckpt]
    if missing:
        raise UsageError(f"--resume {path}: the checkpoint lacks {', '.join(missing)}")
    try:
        Hyperparams(**ckpt["params"])
    except TypeError:
        raise UsageError(f"--resume {path}: the checkpoint's hyperparameters are not this version's") from None
    if not isinstance(ckpt["frame_idx"], int) or ckpt["frame_idx"] < 0:
        raise UsageError(f"--resume {path}: the checkpoint's frame {ckpt['frame_idx']!r} is not a frame count")
    for name in ("net", "tgt_net"):
        why = _net_mismatch(ckpt[name], ckpt["net"])
        if why:
            raise UsageError(f"--resume {path}: its {name} is not the Nature DQN of {STACK}x84x84 frames ({why})")


def _net_mismatch(state, net) -> str | None:
    """Why ``state`` is not the state dict of a DQN with ``net``'s actions (keys, shapes), or None."""
    import torch

    from lib.model import DQN

    head = net.get("fc.2.weight") if isinstance(net, dict) else None
    if not isinstance(state, dict) or not isinstance(head, torch.Tensor) or head.dim() != 2:
        return "no output layer"
    want = DQN((STACK, *FRAME_SHAPE), head.shape[0]).state_dict()
    if set(state) != set(want):
        return "other layers"
    for key, value in want.items():
        if not isinstance(state[key], torch.Tensor) or state[key].shape != value.shape:
            return f"{key} has another shape"
    return None


def check_resume_env(ckpt: dict, path: str, env: str | None) -> None:
    """A checkpoint goes on in its own env: ``--env`` naming another is refused."""
    saved = describe_checkpoint(ckpt)["env"]
    if env is not None and saved is not None and env != saved:
        raise UsageError(f"--env {env}: the checkpoint {path} was trained on {saved}")


# -- env ids -----------------------------------------------------------------------------------


# -- replay files ------------------------------------------------------------------------------


def open_ring(resume: str, ckpt: dict, stage: str, params, streams: int) -> dict:
    """The replay ring that the checkpoint ``resume`` names, read (memory-mapped, nothing copied
    yet) and checked against ``stage`` with its ``params`` and ``streams`` rings: UsageError in
    one line naming what differs. Returns what ``load_ring`` takes."""
    saved = ckpt["replay"]
    path = os.path.join(os.path.dirname(os.path.abspath(resume)), str(saved.get("file")))
    if not os.path.isfile(path):
        raise UsageError(f"--resume {resume}: its replay buffer {path} is missing")
    state = read_ring(path, f"--resume {resume}: its replay buffer {path}")
    theirs = describe_ring(state, ckpt, f"--resume {resume}: its replay buffer {path}")
    mine = belongs(stage, ckpt["game"], params, streams)
    where = f"--resume {resume}:"
    if theirs["wrappers"] != mine["wrappers"]:
        takers = ", ".join(s for s in STAGES if STAGES[s].wrappers == theirs["wrappers"])
        raise UsageError(
            f"{where} its replay ring holds frames of {FRAMES.get(theirs['wrappers'], theirs['wrappers'])} (stage "
            f"{theirs['stage']}); stage {stage} stores frames of {FRAMES[mine['wrappers']]}, and one ring cannot mix "
            f"the two (stages {takers} can resume it)"
        )
    if theirs["capacity"] != mine["capacity"]:
        raise UsageError(f"--replay-size {mine['capacity']}: the checkpoint's replay buffer holds {theirs['capacity']}")
    if theirs["streams"] != mine["streams"]:
        raise UsageError(f"--envs {streams}: the checkpoint's replay buffer has {theirs['streams']}")
    if theirs.get("game", ckpt["game"]) != ckpt["game"]:
        raise UsageError(f"{where} its replay buffer {path} is for game {theirs['game']!r}, not {ckpt['game']!r}")
    if theirs.get("frame_idx", ckpt["frame_idx"]) != ckpt["frame_idx"]:
        raise UsageError(
            f"{where} its replay buffer {path} was saved at frame {theirs['frame_idx']}, the checkpoint at frame "
            f"{ckpt['frame_idx']}"
        )
    return {"state": state, "from": theirs["layout"], "to": mine["layout"], "stage": theirs["stage"]}


def read_ring(path: str, what: str) -> dict:
    """A replay file's state, memory-mapped; UsageError (``what`` ...) when it cannot be read."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        raise UsageError(f"{what} is not readable: cut short or corrupt ({type(e).__name__})") from None
    if not isinstance(state, dict):
        raise UsageError(f"{what} is not a replay ring")
    return state


# Each layout's arrays: name -> (dimensions before the frame's, dtype name); ``N``: its slots, ``K``: its rings.
_ARRAYS = {
    "ring": {"frames": "uint8", "actions": "int64", "rewards": "float32", "terminated": "bool", "pad": "bool"},
    "device": {"frames": "uint8", "actions": "int64", "rewards": "float32", "terminated": "bool", "pad": "bool",
               "cursor": "int64", "written": "int64", "transitions": "int64", "open": "bool"},
}  # fmt: skip


def describe_ring(state: dict, ckpt: dict, what: str) -> dict:
    """``belongs`` of a replay file's ``state`` (read from its keys and its checkpoint where the
    file predates the entry); UsageError where ``state`` is no ring of any layout."""
    layout = "rings" if isinstance(state.get("streams"), list) else "device" if "capacity" in state else "ring"
    rings = state["streams"] if layout == "rings" else [state]
    for ring in rings:
        why = _malformed(ring, "ring" if layout != "device" else "device")
        if why:
            raise UsageError(f"{what} is not a replay ring ({why})")
    frames = rings[0]["frames"]
    if layout == "device":
        streams, per = int(state["streams"]), frames.shape[0] // max(1, int(state["streams"]))
    else:
        streams, per = len(rings), frames.shape[0]
    if (tuple(frames.shape[1:]) != FRAME_SHAPE) or any(r["frames"].shape != frames.shape for r in rings):
        raise UsageError(f"{what} holds frames of {tuple(frames.shape[1:])}, not {FRAME_SHAPE}")
    if isinstance(state.get("belongs"), dict):
        return {**state["belongs"], "layout": layout, "streams": streams, "per_ring": per}
    inferred = describe_checkpoint(ckpt)
    inferred.pop("game", None)  # an older file says nothing of its game or frame: its checkpoint does
    return {**inferred, "layout": layout, "streams": streams, "per_ring": per}


def _malformed(ring: dict, layout: str) -> str | None:
    import torch

    for name, dtype in _ARRAYS[layout].items():
        value = ring.get(name)
        if not isinstance(value, torch.Tensor) or str(value.dtype) != f"torch.{dtype}":
            return f"no {dtype} array {name!r}"
    slots = ring["frames"].shape[0]
    if ring["frames"].dim() != 3 or any(ring[n].numel() != slots for n in ("actions", "rewards", "terminated", "pad")):
        return "arrays of different lengths"
    if layout == "ring" and not all(isinstance(ring.get(n), (int, bool)) for n in ("cursor", "written", "_open")):
        return "no cursor"
    return None


def record(folder: str, ckpt: dict, changed: dict, ring: bool) -> list[dict]:
    """The run's resumes with this one last: those the checkpoint kept (none in a checkpoint from
    before it kept them), then ``{frame, changed, ring, date}``: the frame it goes on from, the
    knobs given again with another value (``{"steps": [4, 2]}``: saved, given), whether the replay
    ring came back (False: the buffer is refilled). Its line goes to ``folder``'s run.log."""
    entry = {
        "frame": ckpt["frame_idx"],
        "changed": {name: list(pair) for name, pair in changed.items()},
        "ring": ring,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    changes = ", ".join(f"--{k.replace('_', '-')} {old} -> {new}" for k, (old, new) in changed.items())
    line = (
        f"{entry['date']} resumed {ckpt['stage']} at frame {entry['frame']} "
        f"({'its replay ring came back' if ring else 'replay buffer refilled'}); changes: {changes or 'none'}\n"
    )
    path = os.path.join(folder, "run.log")
    try:
        with open(path, "a") as f:
            f.write(line)
    except OSError as e:
        raise WriteError(f"{path}: {e.strerror or e}") from None
    return [*ckpt.get("resumes", []), entry]
