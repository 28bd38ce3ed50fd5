"""lib.run.signals: the stop signals of a run, held while a file is written."""

import os
import signal

import pytest

from lib.run import signals
from lib.run.cli import Terminated


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
    assert signal.getsignal(signal.SIGHUP) is signals._raise_stop  # the run's handler is back


def test_a_held_signal_that_is_ignored_stays_ignored(run_handlers):
    signals.ignore_stops()
    with signals.held():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_exit_codes_and_names():
    assert signals.stopped_by(KeyboardInterrupt()) == (130, "SIGINT")
    assert signals.stopped_by(Terminated()) == (143, "SIGTERM")  # raised without its signal
    assert signals.stopped_by(Terminated(signal.SIGHUP)) == (129, "SIGHUP")


SWALLOWED = """
import os, signal, weakref
from lib.run import signals
from lib.run.cli import Terminated
signals.stop_on_signals()
class Thing:
    pass
thing = Thing()
ref = weakref.ref(thing, lambda r: os.kill(os.getpid(), signal.{sig}))  # the handler runs in the callback
del thing
try:
    for _ in range(1000):
        signals.check()
except (KeyboardInterrupt, Terminated) as e:
    print("stopped", *signals.stopped_by(e))
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_whose_raise_python_swallows_is_raised_again_and_not_printed(sig):
    """The handler's raise lands in a weakref callback, where Python swallows it and prints
    "Exception ignored in ..." (07 on SIGTERM did, in a WeakValueDictionary's): nothing is
    printed, and the next ``check`` stops the run with the signal's exit code and name."""
    import subprocess
    import sys

    from lib.run.cli import ROOT

    done = subprocess.run([sys.executable, "-c", SWALLOWED.format(sig=sig)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.stderr == ""
    code = 128 + getattr(signal, sig)
    assert done.stdout.split() == ["stopped", str(code), sig]


def test_recorded_stops_raise_nothing():
    received = []
    restore = signals.record_stops(received)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
    finally:
        restore()
    assert received == [signal.SIGTERM, signal.SIGHUP]
