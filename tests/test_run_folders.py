"""lib.analysis.run_folders: a run's reward_100 curve from its event files over its sittings (training minutes,
the frames a sitting played past its last checkpoint counted once), its speed by phase, and its
resumes with the frames they left untrained."""

import pytest

from lib.analysis.run_folders import load_curve, phase_fps, resumes, settings, settings_text, stitched, untrained_frames


def _raw_events(path, events):
    """An event file written event by event, wall times included (SummaryWriter stamps its
    first event with the time it is made). ``events``: (wall, step, value) with step None for
    the first event, value a number (reward_100), a dict of tag: value, or "START" (the
    session log a writer made with ``purge_step`` writes at that step)."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    with open(path, "wb") as f:
        writer = RecordWriter(f)
        for wall, step, value in events:
            if step is None:
                event = Event(wall_time=wall, file_version="brain.Event:2")
            elif value == "START":
                event = Event(wall_time=wall, step=step, session_log=SessionLog(status=SessionLog.START))
            else:
                tags = value if isinstance(value, dict) else {"reward_100": value}
                values = [Summary.Value(tag=tag, simple_value=v) for tag, v in tags.items()]
                event = Event(wall_time=wall, step=step, summary=Summary(value=values))
            writer.write(event.SerializeToString())
        writer.close()


def test_training_minutes_leave_out_the_time_between_sessions(tmp_path):
    # Session 1 starts at t, logs at minutes 1 and 2; the run resumes an hour after t and logs
    # one and two minutes after that: 58 idle minutes between the sessions. The second file
    # does not say where it resumed (no session log): it continues from the first's last event.
    t = 1_700_000_000.0
    folder = tmp_path / "01-pong-seed0-x"
    folder.mkdir()
    _raw_events(
        folder / "events.out.tfevents.1700000000.host.1.0", [(t, None, 0), (t + 60, 100, -21.0), (t + 120, 200, -20.0)]
    )
    _raw_events(
        folder / "events.out.tfevents.1700003600.host.2.0",
        [(t + 3600, None, 0), (t + 3660, 300, -19.0), (t + 3720, 400, -18.0)],
    )
    assert load_curve(str(folder)) == ([100, 200, 300, 400], [1.0, 2.0, 3.0, 4.0], [-21.0, -20.0, -19.0, -18.0])


def _resumed_run(folder, t):
    """Sitting 1 logs frames 100..400 at minutes 1..4 (its checkpoint was at frame 200, half-way
    between minutes 2 and 3 in time: frame 250 is logged at 2.5); it is stopped, and sitting 2,
    an hour later, resumes from frame 200 and logs 300 and 400 again, at its minutes 1 and 2."""
    _raw_events(
        folder / "events.out.tfevents.1700000000.host.1.0",
        [(t, None, 0)] + [(t + 60 * k, 100 * k, {"reward_100": -21.0 + k, "speed": 100 / 60}) for k in (1, 2, 3, 4)],
    )
    _raw_events(
        folder / "events.out.tfevents.1700003600.host.2.0",
        [(t + 3600, None, 0), (t + 3600, 201, "START"), (t + 3660, 300, {"reward_100": -10.0, "speed": 0.0}),
         (t + 3720, 400, {"reward_100": -9.0, "speed": 100 / 30})],
    )  # fmt: skip


def test_a_resumed_sitting_starts_where_the_sittings_before_it_reached_its_frame(tmp_path):
    t = 1_700_000_000.0
    folder = tmp_path / "08-pong-seed0"
    folder.mkdir()
    _resumed_run(folder, t)
    frames, minutes, values = load_curve(str(folder))
    # Sitting 1's points past frame 200 were played again: only sitting 2's are kept. Sitting 1
    # took 2 minutes to reach frame 200, so sitting 2's minute 1 is the run's minute 3.
    assert frames == [100, 200, 300, 400]
    assert minutes == pytest.approx([1.0, 2.0, 3.0, 4.0])
    assert values == [-20.0, -19.0, -10.0, -9.0]
    # A checkpoint between two logged frames: the time is read between them.
    (folder / "events.out.tfevents.1700003600.host.2.0").unlink()
    _raw_events(
        folder / "events.out.tfevents.1700003600.host.2.0",
        [(t + 3600, None, 0), (t + 3600, 251, "START"), (t + 3660, 300, {"reward_100": -10.0, "speed": 0.0})],
    )
    assert stitched(str(folder))[-1][:2] == (300, pytest.approx(150.0 + 60.0))


def test_speed_by_phase_counts_each_game_once_and_leaves_out_a_sittings_refill(tmp_path):
    t = 1_700_000_000.0
    folder = tmp_path / "08-pong-seed0"
    folder.mkdir()
    _resumed_run(folder, t)
    # Games that ended past frame 100 whose game before ended in the same sitting: sitting 1's
    # 100->200 at 100/60 f/s, then sitting 2's 300->400 at 100/30 (its first game has none
    # before it); sitting 1's 300 and 400 were played again. 200 frames in 60 + 30 seconds.
    assert phase_fps(str(folder), [(100, None), (100, 200), (300, 350)]) == [
        pytest.approx(200 / 90),
        pytest.approx(100 / 60),
        None,
    ]
    # warmup: a sitting's games that began within this many frames of its start are left out.
    # Both counted games began 100 frames after their sitting did (at 0 and at 200).
    assert phase_fps(str(folder), [(0, None)], warmup=100) == [pytest.approx(200 / 90)]
    assert phase_fps(str(folder), [(0, None)], warmup=101) == [None]


def test_resumes_say_whether_their_ring_came_back_and_later_sittings_replace_earlier_ones(tmp_path):
    t = 1_700_000_000.0
    folder = tmp_path / "08-pong-seed0"
    folder.mkdir()
    _resumed_run(folder, t)  # sitting 2 resumed from frame 200; neither its events nor a run.log say how
    assert resumes(str(folder)) == [(200, None)]
    # The sweep's run.log keeps the stage's resume line: the ring of an older sitting.
    (folder / "run.log").write_text(
        "== attempt 1, from its checkpoint\nresuming 08 pong at frame 200: the replay buffer is refilled with "
        "100 transitions before training goes on\n"
    )
    assert resumes(str(folder)) == [(200, False)]
    # Sitting 3 resumes from 300 with its ring (resume_ring 1 at 300); it stops before its next
    # checkpoint. Sitting 4 resumes from 300 again, refilling: its record replaces sitting 3's.
    # Sitting 5 resumes from 350 with its ring. Sitting 6 is stopped before it restored its
    # checkpoint at 500: it says nothing of its ring.
    for n, (frame, ring) in enumerate([(300, 1.0), (300, 0.0), (350, 1.0), (500, None)], start=3):
        tags = {} if ring is None else {"resume_ring": ring}
        events = [(t + 3600 * n, None, 0), (t + 3600 * n, frame + 1, "START")] + (
            [(t + 3600 * n, frame, tags)] if tags else []
        )
        _raw_events(folder / f"events.out.tfevents.{1700000000 + 3600 * n}.host.{n}.0", events)
    assert resumes(str(folder)) == [(200, False), (300, False), (350, True), (500, None)]


def test_untrained_frames_after_resumes():
    # replay_initial 100; the run reached frame 650.
    #   200 without its ring, next resume at 250: 50 frames played before it (fewer than 100)
    #   250 without, next at 500: 100 (the refill)
    #   500 with its ring: 0
    #   600 without, the run ends at 650: 50
    resumed = [(200, False), (250, False), (500, True), (600, False)]
    assert untrained_frames(resumed, 100, 650) == 50 + 100 + 0 + 50
    assert untrained_frames([], 100, 650) == 0
    # A resume whose ring is not known counts only where it played nothing.
    assert untrained_frames([(200, False), (650, None)], 100, 650) == 100
    assert untrained_frames([(200, None)], 100, 650) is None


def test_a_level_is_reached_by_rising_to_it_not_by_the_first_games():
    """A run's first points are the means of a game or two. Stage 01's seed 1 of the 01-05 sweep
    began at reward_100 -19 (one game) and then collapsed to -20.45: it never reached -19, and its
    table must say "—", not 1,013 frames in 0.0 minutes. A run that falls below a level and rises
    to it again reaches it where it rises; one that never starts above a level is as before."""
    from lib.analysis.run_folders import first_reach

    frames, minutes = [1013, 2000, 30000, 69778], [0.0, 0.5, 20.0, 115.0]
    assert first_reach(frames, minutes, [-19.0, -20.0, -20.4, -20.45], -19) is None  # collapsed
    assert first_reach(frames, minutes, [-19.0, -20.0, -18.5, -17.0], -19) == (30000, 20.0)  # fell, rose
    assert first_reach(frames, minutes, [-21.0, -20.0, -15.0, 18.0], -15) == (30000, 20.0)
    assert first_reach(frames, minutes, [-21.0, -20.0, -15.0, 18.0], 18) == (69778, 115.0)
    assert first_reach(frames, minutes, [-21.0, -20.0, -19.5, -19.2], -19) is None


def test_the_settings_a_run_played_with_come_from_each_sitting_of_its_log(tmp_path):
    """A sweep's run.log: bf16 with --steps 1 from the start; a sitting that resumed at 30,000 and
    died is replaced by one that resumed at 20,000 in fp32 with 2 games; stage lines of
    stages 01-05 name no learner, so the stage's own precision stands in."""
    sittings = [
        ("python 08_graph_learner.py --seed 0 --steps 1", None, "stage 08: PongNoFrameskip-v4 x4 on cpu, 2 threads, train step capture: none, learner bf16"),
        ("python 08_graph_learner.py --seed 0 --steps 1 --resume c.pt", 30000, "stage 08: PongNoFrameskip-v4 x4 on cpu, 2 threads, train step capture: none, learner bf16"),
        ("python 08_graph_learner.py --seed 0 --steps=1 --resume c.pt --precision fp32 --envs 2", 20000, "stage 08: PongNoFrameskip-v4 x2 on cpu, 1 threads, train step capture: none, learner fp32"),
    ]  # fmt: skip
    lines = []
    for command, frame, stage_line in sittings:
        lines += ["== attempt 1, from its checkpoint, 2026-12-06T09:00:00", f"== {command}", "== on vm, pid 1"]
        if frame is not None:
            lines.append(f"resuming 08 pong at frame {frame}: with its replay buffer, 0 transitions to refill")
        lines += [stage_line, "PROGRESS stage=08 frame=100 phase=fill fps=1.0"]
    (tmp_path / "run.log").write_text("\n".join(lines) + "\n")
    assert settings(str(tmp_path)) == [(0, "bf16, 1, 4"), (20000, "fp32, 1, 2")]
    assert settings_text(settings(str(tmp_path))) == "bf16, 1, 4 to 20000, then fp32, 1, 2"
    (tmp_path / "run.log").write_text(
        "== attempt 1, from the start, x\n== python 01_dqn_basic.py\nstage 01: PongNoFrameskip-v4 on cpu, 1 threads\n"
    )
    assert settings_text(settings(str(tmp_path), 1, "fp32")) == "fp32, 1, 1"
    assert settings_text(settings(str(tmp_path / "none"))) == "—"
