"""How a stop signal becomes an exception: SIGINT and SIGTERM raise ``StopSignal`` (a KeyboardInterrupt) in the main
thread wherever it is, and ``raise_if_stopped()`` raises it again at the safe points of long loops (each phase of a
training round, each evaluation batch), in case the first one was dropped.

Python drops an exception raised where a signal can land: in a weakref callback or a ``__del__`` (a module lock's,
during an import: "Exception ignored in ..."), and inside a library's bare ``except:`` (datasets' fingerprinting of a
transform). A stop that landed there was lost, and the run trained on.

    restore = handle_stop_signals()   # in the main thread, at the start of a run
    try:
        ...                           # loops call raise_if_stopped()
    except KeyboardInterrupt:         # catches StopSignal
        ...
    finally:
        restore()                     # the previous handlers; the stop is forgotten
"""

from __future__ import annotations

import functools
import signal
import sys
import threading
from collections.abc import Callable


_received: list[int] = []  # the stop signals received since handle_stop_signals(), until restore()


class StopSignal(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised as Ctrl-C's KeyboardInterrupt (``except KeyboardInterrupt`` catches it). A subclass
    on purpose: CPython marks a plain KeyboardInterrupt that leaves an ``exec`` of a string (dataclasses build their
    methods that way, so any import can) as unhandled for good, and a ``python -m`` program then ends by killing
    itself with SIGINT (status -2) even after it handled the interrupt and returned 130. The mark is set only for
    that exact type (Modules/main.c, Python/pythonrun.c)."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


def raise_stop(signum, frame):
    """A signal handler: remember the stop, and raise ``StopSignal`` where the process is for the first one only. A
    second one would land in the stop's own cleanup (the crash log, the reward workers, the lock) and end the run
    with a traceback: torchrun's agent forwards the launcher's SIGINT to a training process that got it already."""
    _received.append(signum)
    if len(_received) == 1:
        raise StopSignal(signum)


def raise_if_stopped() -> None:
    """A safe point: raise ``StopSignal`` if a stop signal was received (in the main thread; a stop raised here is
    raised again at the next safe point too, until the run catches it and ``restore()`` forgets it)."""
    if _received and threading.current_thread() is threading.main_thread():
        raise StopSignal(_received[0])


def _quiet_about_stops(unraisable, previous) -> None:
    """``sys.unraisablehook``: a ``StopSignal`` that Python drops (in a weakref callback, a ``__del__``) prints
    nothing, since the next safe point raises it again; anything else goes to the previous hook."""
    if not isinstance(unraisable.exc_value, StopSignal):
        previous(unraisable)


def handle_stop_signals() -> Callable[[], None]:
    """From here on SIGINT and SIGTERM raise ``StopSignal`` (main thread only, as any signal handler). Returns what
    puts the previous handlers and unraisable hook back and forgets the stops received."""
    _received.clear()
    previous = {signum: signal.signal(signum, raise_stop) for signum in (signal.SIGTERM, signal.SIGINT)}
    hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_quiet_about_stops, previous=hook)

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = hook
        _received.clear()

    return restore
