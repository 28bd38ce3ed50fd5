"""How a run meets the signals that stop it: Ctrl-C (SIGINT), SIGTERM (the sweep, the bench, a
service manager) and SIGHUP (its terminal closed).

While it runs (``stop_on_signals``), SIGINT raises KeyboardInterrupt and SIGTERM and SIGHUP
raise ``Terminated`` carrying the signal; the entry point turns either into the exit code
128 + the signal's number and the ``interrupted`` name (``stopped_by``). While a file is being
written (``held``), the three are recorded instead and acted on once the file is whole under
its real name: a signal never cuts a checkpoint or a model in half, and the stop it asks for
comes a few hundred milliseconds later. Handlers are Python's, so that a signal which the
kernel hands to another thread (torch's, TensorBoard's writer) is held all the same.

A handler's raise can land where Python swallows it: in a weakref callback or a ``__del__``
(Python prints "Exception ignored in ..." and goes on). The signal is therefore also kept as
pending until the entry point has acted on it (``stopped_by``): such a raise is not printed, and
the run's next ``check`` (each loop iteration, each wait for the play process) raises it again.
A loop that waits in code which wraps what a handler raises (Ray's ``ray.wait`` makes it a
SystemError) records the signals instead (``record_stops``) and looks at them between waits.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

from lib.run.cli import Terminated

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_holding = False  # a ``held`` block is open (they nest: the outermost acts on the signal)
_pending: list[int] = []  # stop signals raised and not yet acted on by the entry point


def _stop(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _raise_stop(signum, frame):
    _pending.append(signum)
    raise _stop(signum)


def check() -> None:
    """Raise the stop a signal asked for where its first raise was swallowed (see above)."""
    if _pending:
        raise _stop(_pending[0])


def stop_on_signals():
    """Install the run's handlers; returns the function that puts the previous ones back.

    Ctrl-C stops the run even where the shell started it with SIGINT ignored (a background
    job of a non-interactive shell): Python then never raises KeyboardInterrupt."""
    old = {sig: signal.getsignal(sig) for sig in STOPS}
    old_hook = sys.unraisablehook
    _pending.clear()
    for sig in STOPS:
        signal.signal(sig, _raise_stop)

    def quiet(unraisable):
        if not (_pending and isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated))):
            old_hook(unraisable)  # a stop's swallowed raise is not news: ``check`` raises it again

    sys.unraisablehook = quiet

    def restore():
        for sig, handler in old.items():
            signal.signal(sig, handler)
        sys.unraisablehook = old_hook
        _pending.clear()

    return restore


def record_stops(received: list[int]):
    """Install handlers that append the signal's number to ``received`` and raise nothing;
    returns the function that puts the previous ones back. For a loop that waits in code which
    would wrap or swallow a raise: it looks at ``received`` between its waits."""
    old = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in STOPS}

    def restore():
        for sig, handler in old.items():
            signal.signal(sig, handler)

    return restore


def ignore_stops() -> None:
    """From here on the three signals are ignored (the wrap-up of a run, the process's exit)."""
    for sig in STOPS:
        signal.signal(sig, signal.SIG_IGN)


def stopped_by(e: BaseException) -> tuple[int, str]:
    """(exit code, signal name) of a KeyboardInterrupt or ``Terminated``; the stop is acted on
    (no longer pending)."""
    _pending.clear()
    signum = e.args[0] if isinstance(e, Terminated) and e.args else signal.SIGTERM
    if isinstance(e, KeyboardInterrupt):
        signum = signal.SIGINT
    return 128 + int(signum), signal.Signals(signum).name


@contextlib.contextmanager
def held():
    """Within: SIGINT, SIGTERM and SIGHUP are recorded, not acted on. On leaving, however the
    block ends, the handlers are back and the first signal recorded is acted on as its handler
    says (a raise, for a run's; nothing where it is ignored). Outside the main thread, and
    inside another ``held`` block, nothing changes."""
    global _holding
    if _holding or threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in STOPS}
    _holding = True
    try:
        yield
    finally:
        _holding = False
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if received:
            _act(received[0], old[received[0]])


def _act(signum: int, handler) -> None:
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)
