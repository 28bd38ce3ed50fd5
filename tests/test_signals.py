"""lib.signals: the stop signals of a run, held while a file is written."""

import os
import signal

import pytest

from lib import signals
from lib.cli import Terminated


@pytest.fixture
def run_handlers():
    restore = signals.stop_on_signals()
    yield
    restore()


def test_a_held_signal_is_acted_on_when_the_block_ends(run_handlers):
    done = []
    with pytest.raises(Terminated) as stop:
        with signals.held():
            os.kill(os.getpid(), signal.SIGHUP)
            with signals.held():  # nested: the outermost acts
                os.kill(os.getpid(), signal.SIGINT)
            done.append("inner")
            done.append("outer")
    assert done == ["inner", "outer"]
    assert signals.stopped_by(stop.value) == (129, "SIGHUP")  # the first signal received
    assert signal.getsignal(signal.SIGHUP) is signals._raise_terminated  # the run's handler is back


def test_a_held_signal_that_is_ignored_stays_ignored(run_handlers):
    signals.ignore_stops()
    with signals.held():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_exit_codes_and_names():
    assert signals.stopped_by(KeyboardInterrupt()) == (130, "SIGINT")
    assert signals.stopped_by(Terminated()) == (143, "SIGTERM")  # raised without its signal
    assert signals.stopped_by(Terminated(signal.SIGHUP)) == (129, "SIGHUP")
