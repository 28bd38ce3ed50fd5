"""A replay ring in its file (``replay-<frame>.pt``, ``--save-replay``): written with what it
belongs to (``lib.run.resume.ring_belongs``) after checking the disk has room, and loaded into the
resuming stage's buffer, converted between stage 07's rings and stage 08's device rings (the
same contents in two forms; the rules are ``lib.run.resume``'s)."""

from __future__ import annotations

from lib.params import FRAME_SHAPE, STACK
from lib.run.disk import need_room
from lib.run.stages import STAGES


def load_ring(buffer, ring: dict, stage: str, ckpt: dict) -> str:
    """Load a ring that ``open_ring`` read into ``buffer`` (the resuming stage's), converting
    between stage 07's and stage 08's forms; returns how, in words ("" when loaded as saved)."""
    state, source, target = ring["state"], ring["from"], ring["to"]
    how = ""
    if (source, target) == ("rings", "device"):
        state, how = _rings_to_device(state), f", converted from stage {ring['stage']}'s rings"
    elif (source, target) == ("device", "rings"):
        state, how = _device_to_rings(state, buffer), f", converted from stage {ring['stage']}'s device rings"
    elif target == "ring" and STAGES[stage].play == "inline" and "env" not in ckpt and state["_open"]:
        # No game in progress was saved: this stage starts a new one, which must not continue the ring's episode.
        state, how = {**state, "_open": False}, ", its open episode closed (no game in progress was saved)"
    buffer.load_state_dict(state)
    return how


def _rings_to_device(state: dict) -> dict:
    """Stage 07's rings (StreamReplayBuffer) in stage 08's form (DeviceReplayBuffer)."""
    import torch

    rings = state["streams"]
    out = {
        "capacity": sum(r["frames"].shape[0] for r in rings),
        "streams": len(rings),
        "stack": STACK,
        "frame_shape": list(FRAME_SHAPE),
        "open": torch.tensor([bool(r["_open"]) for r in rings]),
    }
    for name in ("frames", "actions", "rewards", "terminated"):
        out[name] = torch.cat([r[name] for r in rings])
    out["pad"] = torch.stack([r["pad"] for r in rings])
    for name in ("cursor", "written", "transitions"):
        out[name] = torch.tensor([int(r[name]) for r in rings], dtype=torch.int64)
    return out


def _device_to_rings(state: dict, buffer) -> dict:
    """Stage 08's rings (DeviceReplayBuffer) in stage 07's form; each ring and the batch split
    keep ``buffer``'s own generators, as seeded by this run."""
    k = int(state["streams"])
    per = state["frames"].shape[0] // k
    rings = []
    for i, own in enumerate(buffer.streams):
        ring = {name: state[name][i * per : (i + 1) * per] for name in ("frames", "actions", "rewards", "terminated")}
        ring["pad"] = state["pad"][i]
        ring.update({name: int(state[name][i]) for name in ("cursor", "written", "transitions")})
        ring.update(_open=bool(state["open"][i]), rng=own.rng.bit_generator.state)
        rings.append(ring)
    return {"streams": rings, "rng": buffer.rng.bit_generator.state}


def save_ring(buffer, info: dict, f, then: int = 0) -> None:
    """Write ``buffer``'s state with what it belongs to into the open file ``f``, after checking
    that the disk has room for it and for the ``then`` bytes to be written after it (its
    checkpoint): OSError ENOSPC before a byte is written, where it has not."""
    import torch

    state = buffer.state_dict()
    need_room(f.name if isinstance(getattr(f, "name", None), str) else None, nbytes(state), then)
    torch.save({**state, "belongs": info}, f)


def nbytes(state) -> int:
    """The bytes of the tensors in ``state`` (dicts and lists of them): what saving it writes,
    less a little framing."""
    if isinstance(state, dict):
        return sum(nbytes(v) for v in state.values())
    if isinstance(state, list):
        return sum(nbytes(v) for v in state)
    return state.nelement() * state.element_size() if hasattr(state, "element_size") else 0
