"""Tests for lib.run.timing: the part clock's arithmetic on a fake clock, a play process's clock read
across processes, the bound, the TIME line, TensorBoard points; and, on CUDA, the train step's
device time read without a sync. A whole stage's time by part is tested in test_stages."""

from __future__ import annotations

import time

import pytest
import torch

import lib.run.timing as timing
from lib import parallel
from lib.run.summary import time_line
from lib.run.timing import PartClock, RunClocks, bound


class FakeClock:
    def __init__(self):
        self.now = 100.0
        self.reads = 0

    def perf_counter(self) -> float:
        self.reads += 1
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake.perf_counter)
    return fake


def test_each_start_charges_the_part_before_and_the_part_in_progress_counts_when_read(clock):
    parts = PartClock(("env", "act", "put"))
    parts.start("act")
    clock.now += 1.0
    parts.start("env")
    clock.now += 2.0
    parts.start("put")
    clock.now += 0.5
    parts.start("env")
    clock.now += 0.25
    # Written out: act 1.0; env 2.0 + 0.25 (in progress when read); put 0.5.
    assert parts.seconds(clock.now) == {"env": 2.25, "act": 1.0, "put": 0.5}
    assert parts.seconds(clock.now + 1.0)["env"] == 3.25  # read later by another process: still running


class Ring:
    """A stand-in's target: its methods take ``seconds`` of the fake clock."""

    def __init__(self, clock):
        self.clock, self.size = clock, 7

    def add(self, seconds):
        self.clock.now += seconds
        return "added"

    def sample(self, seconds):
        self.clock.now += seconds
        return "batch"

    def __len__(self):
        return self.size


class Stager:
    """Samples through the ring it is given, as ``PinnedStager.sample`` does."""

    def sample(self, buffer, seconds):
        buffer.clock.now += 1.0
        return buffer.sample(seconds)


def test_timed_stand_ins_charge_their_calls_and_the_rest_of_the_loop_goes_to_rest(clock):
    parts = PartClock(("env", "act", "write", "step", "log"), rest="log")
    buffer = parts.timed(Ring(clock), add="write", sample="step")
    stager = parts.timed(Stager(), sample="step")
    act = parts.timed(lambda seconds: setattr(clock, "now", clock.now + seconds) or 3, "act")
    clock.now += 9.0  # before the first timed call: no part in progress, nothing charged
    assert act(0.5) == 3  # act 0.5
    clock.now += 0.25  # log 0.25 (the rest)
    assert buffer.add(2.0) == "added"  # write 2.0
    reads = clock.reads
    assert stager.sample(buffer, 4.0) == "batch"  # step 1.0 + 4.0: the ring's sample within it adds no lap
    assert clock.reads == reads + 2  # one lap in, one out (on CUDA: one event pair)
    clock.now += 0.125  # log 0.125
    assert len(buffer) == 7 and buffer.size == 7 and buffer.clock is clock  # the rest is the ring's own
    # Written out: act 0.5; write 2.0; step 5.0; log 0.25 + 0.125; env never.
    assert parts.seconds(clock.now) == {"env": 0.0, "act": 0.5, "write": 2.0, "step": 5.0, "log": 0.375}


def test_a_timed_call_gives_the_time_back_to_the_part_it_interrupted_even_when_it_raises(clock):
    parts = PartClock(("env", "act", "put"), rest="env")

    def fails():
        clock.now += 1.0
        raise RuntimeError("the env failed")

    put = parts.timed(lambda: setattr(clock, "now", clock.now + 2.0), "put")
    act = parts.timed(fails, "act")
    parts.start("act")  # a part in progress: the calls return to it, not to env
    clock.now += 0.5
    put()
    clock.now += 0.25
    with pytest.raises(RuntimeError, match="the env failed"):
        act()  # within act already: no lap
    parts.start("env")
    put()
    clock.now += 4.0
    # Written out: act 0.5 + 0.25 + 1.0; put 2.0 + 2.0; env 4.0 (the rest, after the last put).
    assert parts.seconds(clock.now) == {"env": 4.0, "act": 1.75, "put": 4.0}
    with pytest.raises(ValueError, match="unknown part 'step'"):
        parts.timed(fails, "step")
    with pytest.raises(ValueError, match="rest part"):
        PartClock(("env",)).timed(fails, "env")


def test_window_per_1000_frames_other_and_bound(clock):
    clocks = RunClocks("cpu", play=False)
    trainer = clocks.trainer
    trainer.start("env")
    clock.now += 5.0  # before the window: not counted
    clocks.mark(1000)
    clock.now += 1.0
    trainer.start("step")
    clock.now += 3.0
    trainer.start("log")
    clock.now += 0.5
    figures = clocks.figures(3000, start_frame=0)
    # Written out over the window (2,000 frames, 4.5 s): env 1.0 s, step 3.0 s, log 0.5 s, other 0.
    # Per 1,000 frames: env 0.5, step 1.5, log 0.25; the trainer alone is busy: its largest part bounds it.
    assert figures["window"] == "train" and figures["frames"] == 2000
    trainer_fig = figures["processes"]["trainer"]
    assert trainer_fig["wall_seconds"] == 4.5
    assert trainer_fig["per_1000_frames"] == {"env": 0.5, "step": 1.5, "log": 0.25, "other": 0.0}
    assert figures["bound"] == "trainer:step"
    assert time_line("01", figures) == (
        "TIME stage=01 bound=trainer:step trainer.env=0.50 trainer.step=1.50 trainer.log=0.25 "
        "trainer.other=0.00 trainer.wall=2.25"
    )


def test_no_training_window_is_the_whole_sitting_and_no_frames_give_no_bound(clock):
    clocks = RunClocks("cpu", play=False)
    clocks.trainer.start("env")
    clock.now += 2.0
    figures = clocks.figures(500, start_frame=100)
    assert figures["window"] == "sitting" and figures["frames"] == 400
    assert figures["processes"]["trainer"]["per_1000_frames"]["env"] == 5.0
    empty = clocks.figures(100, start_frame=100)
    assert empty["bound"] is None and time_line("01", empty) == "TIME stage=01 bound=none frames=0"


def test_bound_is_the_busiest_process_largest_part_that_is_not_a_wait():
    def procs(**figures):
        return {name: {"per_1000_frames": parts} for name, parts in figures.items()}

    # The play process waits on put most of the time: the trainer is busier, its step bounds.
    assert bound(procs(play={"env": 2.0, "put": 8.0}, trainer={"get": 0.5, "step": 9.0, "log": 0.5})) == "trainer:step"
    # The trainer waits on get: the play process bounds, by its env step (a wait never bounds).
    assert bound(procs(play={"env": 7.0, "act": 2.0, "put": 0.1}, trainer={"get": 6.0, "step": 3.0})) == "play:env"
    # The device's train steps take longer than either process is busy.
    play, trainer = {"env": 3.0, "put": 1.0}, {"get": 0.5, "pace": 3.0, "step": 0.4, "other": 0.1}
    assert bound(procs(play=play, trainer=trainer, device={"step": 3.5})) == "device:step"
    # "other" counts as busy but is never named.
    assert bound(procs(trainer={"env": 1.0, "other": 5.0})) == "trainer:env"


class FakeWriter:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))


def test_tensorboard_points_are_seconds_per_1000_frames_since_the_last(clock):
    clocks = RunClocks("cpu", play=False)
    writer = FakeWriter()
    clocks.trainer.start("step")
    clocks.log(writer, 0)  # the first point only starts the interval
    assert writer.scalars == []
    clock.now += 2.0
    clocks.log(writer, 4000)
    got = {tag: value for tag, value, step in writer.scalars if step == 4000}
    assert got == {"time/trainer.step": 0.5, "time/trainer.other": 0.0, "time/trainer.wall": 0.5}


def test_the_first_training_point_starts_at_the_mark_and_the_last_is_the_final_reading(clock):
    """A run shorter than TIME_FRAMES still gets one time/ point: the run's end writes the figures
    of its final reading, over the window from the first train step."""
    clocks = RunClocks("cpu", play=False)
    writer = FakeWriter()
    clocks.trainer.start("env")
    clock.now += 7.0  # filling the buffer: not in the window
    clocks.mark(1000)
    clocks.trainer.start("step")
    clock.now += 3.0
    figures = clocks.figures(3000, start_frame=0)
    clock.now += 5.0  # the run's end after its reading (the play process stopped): not counted
    clocks.log(writer, 3000, final=True)
    got = {tag: value for tag, value, step in writer.scalars if step == 3000}
    assert got == {
        "time/trainer.env": 0.0,
        "time/trainer.step": 1.5,
        "time/trainer.other": 0.0,
        "time/trainer.wall": 1.5,
    }
    assert figures["processes"]["trainer"]["per_1000_frames"]["step"] == 1.5


def _play_loop(clock, seconds):
    """A stand-in play process: env 3 ms, act 1 ms, put 2 ms, per step, for ``seconds``."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        clock.start("act")
        time.sleep(0.001)
        clock.start("env")
        time.sleep(0.003)
        clock.start("put")
        time.sleep(0.002)


def test_a_play_process_clock_reaches_the_trainer_and_adds_up_to_the_wall():
    """The play side's clock travels to the child as a process argument (shared slots); the
    trainer reads it while the child runs: the parts add up to the window's wall time."""
    clocks = RunClocks("cpu", play=True)
    child = parallel.context().Process(target=_play_loop, args=(clocks.play, 3.0), daemon=True)
    child.start()
    try:
        deadline = time.monotonic() + 30
        while clocks.play.seconds(time.perf_counter())["env"] == 0.0:  # the child is in its loop
            assert time.monotonic() < deadline, "the play process never started its clock"
            time.sleep(0.05)
        clocks.mark(0)
        time.sleep(1.0)
        figures = clocks.figures(1000, start_frame=0)
    finally:
        child.join(10)
    play = figures["processes"]["play"]
    parts = play["seconds"]
    named = parts["env"] + parts["act"] + parts["put"]
    assert abs(named - play["wall_seconds"]) <= 0.03 * play["wall_seconds"], play
    # About 3:1:2 (sleeps overshoot a little, the same for each).
    assert parts["env"] > parts["put"] > parts["act"] > 0.05, parts


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_train_step_device_time_from_events_without_a_sync():
    """On CUDA the step part is also timed on the device by events, read at log points with
    Event.query: under sync debug mode "error" a hidden sync would raise."""
    clocks = RunClocks("cuda", play=False)
    trainer = clocks.trainer
    a = torch.randn(2048, 2048, device="cuda")
    writer = FakeWriter()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        clocks.mark(0)
        for frame in range(1, 21):
            trainer.start("step")
            a = (a @ a).tanh()
            trainer.start("log")
            if frame % 10 == 0:
                clocks.log(writer, frame * 100)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    figures = clocks.figures(2000, start_frame=0, wait=True)
    device = figures["processes"]["device"]["per_1000_frames"]["step"]
    assert device > 0 and not clocks.trainer.device.pending
    assert "device.step=" in time_line("08", figures)


def test_a_stall_is_charged_to_stalled_not_to_the_open_part():
    """stall(t) (the trainer, seeing the play process silent since t): the part in progress is
    charged up to t, then ``stalled`` is in progress until the process's next lap, whatever
    part it was in, so a stop inside a put goes to ``stalled``, and the put's own time to put."""
    parts = PartClock(("env", "act", "put", "stalled"), rest="env")
    put = parts.timed(lambda: None, "put")
    parts.start("put")
    now = time.perf_counter()
    parts._view[parts._since] = now - 5.0  # put began 5 s ago, its last 3 s silent
    parts.stall(now - 3.0)
    assert parts.seconds(now)["put"] == pytest.approx(2.0, abs=0.01)
    assert parts.seconds(now)["stalled"] == pytest.approx(3.0, abs=0.01)
    parts.start("env")  # the process continued: its lap ends the stall
    put()
    got = parts.seconds(time.perf_counter())
    assert got["put"] == pytest.approx(2.0, abs=0.1) and got["stalled"] == pytest.approx(3.0, abs=0.1)
    fresh = PartClock(("env", "stalled"), rest="env")
    fresh.stall(now - 3.0)  # silent before its first lap: nothing is open, nothing is charged
    assert fresh.seconds(now) == {"env": 0.0, "stalled": 0.0}


def test_the_bound_never_names_a_wait():
    """lag_wait and stalled are waits: a play process that mostly waited does not bound the run."""
    play = {"env": 1.0, "act": 0.5, "put": 0.2, "lag_wait": 9.0, "stalled": 0.0}
    assert bound({"play": {"per_1000_frames": play}, "trainer": {"per_1000_frames": {"get": 2.0, "step": 8.0}}}) == (
        "trainer:step"
    )
    play = {"env": 0.3, "stalled": 50.0, "other": 0.0}
    assert bound({"play": {"per_1000_frames": play}, "trainer": {"per_1000_frames": {"get": 49.0, "step": 1.0}}}) == (
        "trainer:step"
    )
