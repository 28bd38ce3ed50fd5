"""lib.runs: a run's reward_100 curve from its event files, minutes with and without the time
between a resumed run's sessions."""

from lib.runs import load_curve


def _raw_events(path, events):
    """An event file written event by event, wall times included (SummaryWriter stamps its
    first event with the time it is made)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    with open(path, "wb") as f:
        writer = RecordWriter(f)
        for wall, step, value in events:
            if step is None:
                event = Event(wall_time=wall, file_version="brain.Event:2")
            else:
                event = Event(
                    wall_time=wall,
                    step=step,
                    summary=Summary(value=[Summary.Value(tag="reward_100", simple_value=value)]),
                )
            writer.write(event.SerializeToString())
        writer.close()


def test_training_minutes_leave_out_the_time_between_sessions(tmp_path):
    # Session 1 starts at t, logs at minutes 1 and 2; the run resumes an hour after t and logs
    # one and two minutes after that: 58 idle minutes between the sessions.
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
    assert load_curve(str(folder))[1] == [1.0, 2.0, 61.0, 62.0]
    assert load_curve(str(folder), between_sessions=False)[1] == [1.0, 2.0, 3.0, 4.0]
