"""What checkpoints and replay files belong to (lib.run.resume), their rings in files (lib.run.ring_files), and the rings one stage takes from another:
stage 07's rings and stage 08's convert both ways slot for slot, a ring of a stage that saved
no game in progress is closed for a stage that plays in its own process, env ids that are not
Atari games are refused, and a failed write says the OS's reason."""

import errno
import io

import numpy as np
import pytest
import torch

from lib.buffer import ReplayBuffer
from lib.buffer_games import StreamReplayBuffer
from lib.params import GAMES
from lib.replay_device import DeviceReplayBuffer
from lib.run import disk, env_check, resume, ring_files
from lib.run.cli import UsageError


def _play(buffer, rng, steps: int) -> None:
    """Episodes of random lengths in each ring of ``buffer`` (a StreamReplayBuffer), frames
    numbered so that every slot's frame is unique, until every ring has wrapped."""
    frame = 0
    for ring in buffer.streams:
        for _ in range(steps):
            if not ring._open:
                ring.start_episode(np.stack([np.full((84, 84), (frame + i) % 251, np.uint8) for i in range(4)]))
                frame += 4
            done = rng.random() < 0.1
            ring.add_step(int(rng.integers(6)), float(rng.choice([-1.0, 0.0, 1.0])), done and rng.random() < 0.5,
                          np.full((84, 84), frame % 251, np.uint8), done)  # fmt: skip
            frame += 1


def _ring(state, source, target, stage="07"):
    return {"state": state, "from": source, "to": target, "stage": stage}


def test_07_rings_and_08_device_rings_hold_the_same_transitions_both_ways():
    rng = np.random.default_rng(0)
    rings = StreamReplayBuffer(60, 3, seed=1)
    _play(rings, rng, steps=47)  # 20 slots a ring: each ring wraps twice, some end mid-episode
    device = DeviceReplayBuffer(60, 3)
    how = ring_files.load_ring(device, _ring(rings.state_dict(), "rings", "device"), "08", {})
    assert how == ", converted from stage 07's rings"
    assert len(device) == len(rings)
    # Slot for slot: the same sampleable transitions, and the same stacks, actions, rewards and flags.
    for i, ring in enumerate(rings.streams):
        slots = np.arange(20)
        flat = torch.from_numpy(slots + 20 * i)
        assert device.valid[flat].bool().tolist() == ring.valid(slots).tolist(), i
        ok = slots[ring.valid(slots)]
        got = device.gather(torch.from_numpy(ok + 20 * i))
        rows = (ok[:, None] + ring._offsets) % 20
        want = (ring.frames[rows[:, :-1]], ring.actions[ok], ring.rewards[ok], ring.terminated[ok],
                ring.frames[rows[:, 1:]])  # fmt: skip
        for g, w in zip(got, want):
            assert np.array_equal(g.numpy(), w), i
    assert device.open.tolist() == [r._open for r in rings.streams]

    back = StreamReplayBuffer(60, 3, seed=7)
    own_rng = back.streams[0].rng.bit_generator.state
    how = ring_files.load_ring(back, _ring(device.state_dict(), "device", "rings", "08"), "07", {})
    assert how == ", converted from stage 08's device rings"
    for mine, theirs in zip(back.streams, rings.streams):
        for name in ("frames", "actions", "rewards", "terminated", "pad"):
            assert np.array_equal(getattr(mine, name), getattr(theirs, name)), name
        assert (mine.cursor, mine.written, mine.transitions, mine._open) == (
            theirs.cursor, theirs.written, theirs.transitions, theirs._open)  # fmt: skip
    assert back.streams[0].rng.bit_generator.state == own_rng  # its draws are this run's own


def test_a_ring_without_its_game_closes_its_episode_for_a_stage_that_plays_in_process():
    ring = ReplayBuffer(16, seed=0)
    ring.start_episode(np.zeros((4, 84, 84), np.uint8))
    ring.add_step(1, 0.0, False, np.ones((84, 84), np.uint8), False)
    assert ring._open
    loaded = ReplayBuffer(16, seed=0)
    how = ring_files.load_ring(loaded, _ring(ring.state_dict(), "ring", "ring", "03"), "01", {"stage": "03"})
    assert not loaded._open and "open episode closed" in how and len(loaded) == 1
    # Saved with its game in progress (01, 02), the episode goes on where the game does.
    again = ReplayBuffer(16, seed=0)
    assert ring_files.load_ring(again, _ring(ring.state_dict(), "ring", "ring", "01"), "02", {"env": {}}) == ""
    assert again._open
    # Stages that play in their own process start every ring's episode themselves.
    assert ring_files.load_ring(ReplayBuffer(16), _ring(ring.state_dict(), "ring", "ring", "01"), "05", {}) == ""


def test_a_checkpoint_from_before_its_belongs_entry_is_read_from_its_fields():
    params = GAMES["pong"].replace(replay_size=1000)
    old = {"stage": "07", "game": "pong", "wrappers": "vector", "params": {"env_name": params.env_name,
           "replay_size": 1000}, "knobs": {"steps": 4, "envs": 4}, "replay": {"file": "replay-8.pt",
           "capacity": 1000, "streams": 4}}  # fmt: skip
    new = resume.belongs("07", "pong", params, 4)
    assert resume.describe_checkpoint(old) == new
    assert new["layout"] == "rings" and resume.belongs("08", "pong", params, 4)["layout"] == "device"
    assert resume.belongs("03", "pong", params, 4)["streams"] == 1  # one ring, whatever --envs says


@pytest.mark.parametrize(
    "stage, env_id, words",
    [
        ("01", "CartPole-v1", "RGB frames"),
        ("05", "FrozenLake-v1", "RGB frames"),
        ("07", "CartPole-v1", "'cart_pole' is none of them"),
        ("08", "tests.support.sidetarget:SideTarget-v0", "is none of them"),
    ],
)
def test_env_ids_that_are_not_atari_games_are_refused(stage, env_id, words):
    with pytest.raises(UsageError, match="is not an Atari game") as e:
        env_check.check_env(env_id, stage)
    assert words in str(e.value)


def test_atari_games_and_lookalikes_pass():
    for stage in ("01", "05", "07", "08"):
        env_check.check_env("PongNoFrameskip-v4", stage)
        env_check.check_env("ALE/Breakout-v5", stage)
    env_check.check_env("tests.support.sidetarget:SideTarget-v0", "06")  # an env that quacks like ALE


class _FullFile(io.RawIOBase):
    """A file whose writes fail with ENOSPC after ``room`` bytes, as a full disk's do."""

    def __init__(self, room: int):
        self.room = room

    def writable(self):
        return True

    def write(self, data):
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(data)


def test_a_failed_write_names_the_os_reason_behind_torchs_words(tmp_path):
    with pytest.raises(RuntimeError) as e:
        torch.save({"a": torch.zeros(100_000)}, _FullFile(1000))
    assert "No space left" not in str(e.value)  # torch's own words: "unexpected pos ..."
    assert disk.write_reason(e.value, str(tmp_path / "x.tmp")) == "No space left on device"


def test_a_ring_that_does_not_fit_the_disk_is_not_written(tmp_path, monkeypatch):
    import shutil

    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: usage._replace(free=1000))
    path = tmp_path / "replay-8.pt"
    with open(path, "wb") as f, pytest.raises(OSError) as e:
        ring_files.save_ring(ReplayBuffer(16), {"stage": "01"}, f)
    assert e.value.errno == errno.ENOSPC and "needed" in e.value.strerror
    assert path.stat().st_size == 0
