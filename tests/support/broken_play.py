"""A deliberately broken play process for the whole-run tests (``tests/test_weights_age.py``): each
transition it sends carries the frame before the new one, a stale frame. Started in place of a
stage's ``play`` (``functools.partial(send_stale_frames, play)``), in the play process, where a
test's monkeypatch cannot reach."""

from lib import parallel


def send_stale_frames(play, *args):
    send, previous = parallel.send, []

    def stale(queue, item, parent_pid):
        frame = previous[0] if previous else item.next_frame
        previous[:] = [item.next_frame.copy()]
        send(queue, item._replace(next_frame=frame), parent_pid)

    parallel.send = stale
    play(*args)
