"""How a stop signal becomes an exception: SIGINT, SIGTERM and SIGHUP raise ``StopSignal`` (a KeyboardInterrupt) in
the main thread wherever it is, and ``raise_if_stopped()`` raises it again at the safe points of long loops (each
phase of a training round, each evaluation batch), since Python drops an exception raised in a weakref callback, a
``__del__`` or a library's bare ``except:``.

``python -m hf_grpo.train`` handles them from its first line, before torch loads (``guard_start``): a stop while it
starts ends it at once with one line and status 130 (raised there, it could leave a module half-imported). A launched
training process asks Linux for SIGTERM when the process that started it dies (``die_with_parent``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable


# SIGHUP is a stop like SIGTERM (where the platform has it); all three end a run the same way, with status 130
STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)
STOP_STATUS = 130
LAUNCHED_ENV = "HF_GRPO_LAUNCHED"  # set by the launcher (hf_grpo.launch.launcher) for the training processes it starts
PARENT_ENV = (
    "HF_GRPO_LAUNCH_PID"  # the pid of the process that starts the training processes (hf_grpo.base.crash_log's)
)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
LAUNCHERS = (b"accelerate", b"torchrun", b"torch.distributed.run")  # a container's first process may be one

_received: list[int] = []  # the stop signals received since handle_stop_signals(), until restore()
_starting = False  # from guard_start until the first handle_stop_signals()
_resume_command: Callable[[list[str]], str] | None = None  # what the line of a stop while starting names


class StopSignal(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised as Ctrl-C's KeyboardInterrupt (``except KeyboardInterrupt`` catches it). A
    subclass on purpose: CPython marks a plain KeyboardInterrupt that leaves an ``exec`` of a string (dataclasses build
    their methods that way, so any import can) as unhandled for good, and a ``python -m`` program then ends by killing
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
    """From here on SIGINT, SIGTERM and SIGHUP raise ``StopSignal`` (main thread only, as any signal handler). Returns
    what puts the previous handlers and unraisable hook back and forgets the stops received. Ends the start of a
    command (``guard_start``): a run that can stop cleanly is under way."""
    global _starting
    _starting = False
    _received.clear()
    previous = {signum: signal.signal(signum, raise_stop) for signum in STOP_SIGNALS}
    hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_quiet_about_stops, previous=hook)

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = hook
        _received.clear()

    return restore


@contextlib.contextmanager
def stops_held():
    """Stop signals wait (blocked, on Linux) until the block ends: for a few statements that must run together, such
    as writing a line and noting that it was written."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


# ---------------------------------------------------------------------------------------------------------------------
# The start of a training command, before torch loads


def inside_launch() -> bool:
    """True in a process started by accelerate/torchrun (or by this package's launcher)."""
    return any(name in os.environ for name in ("LOCAL_RANK", "ACCELERATE_USE_CPU", LAUNCHED_ENV))


def training_command(orig_argv: list[str], argv: list[str]) -> bool:
    """Whether this is ``python [options] -m hf_grpo.train`` locating its module: ``orig_argv`` is the interpreter's
    command line (``sys.orig_argv``), ``argv`` is ``sys.argv``, whose first item Python sets to "-m" meanwhile."""
    if argv[:1] != ["-m"] or "-m" not in orig_argv:
        return False
    return orig_argv[orig_argv.index("-m") + 1 : orig_argv.index("-m") + 2] == ["hf_grpo.train"]


def guard_start() -> Callable[[Callable[[list[str]], str]], None]:
    """First thing in ``python -m hf_grpo.train``: until its run handles stops (``handle_stop_signals``), a stop
    signal ends the process at once, with one line (none in a launch's processes: the launcher prints it, or rank 0
    does) and ``STOP_STATUS``; a launched process dies with the process that started it (``die_with_parent``).
    Returns what gives that line the command that resumes (``crash_log.resume_command``, loaded after this)."""
    global _starting
    _starting = True
    for signum in STOP_SIGNALS:
        signal.signal(signum, _exit_at_once)
    die_with_parent()

    def name_resume_command(command: Callable[[list[str]], str]) -> None:
        global _resume_command
        _resume_command = command

    return name_resume_command


def die_with_parent() -> None:
    """In a launched process on Linux: SIGTERM when the process that started it dies (``PR_SET_PDEATHSIG``), and at
    once when it died before this asked (the process then belongs to init or a subreaper: ``parent_gone``)."""
    if not (inside_launch() and sys.platform.startswith("linux")):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if parent_gone():
        os.kill(os.getpid(), signal.SIGTERM)


def parent_gone() -> bool:
    """Whether the process that started this one has died. The launcher's wrapper (``hf_grpo.base.crash_log``) names
    itself in ``PARENT_ENV``; under someone else's ``accelerate launch`` or ``torchrun`` a dead parent left
    this process to init (pid 1), unless init is that launcher (a container's entry point)."""
    expected = os.environ.get(PARENT_ENV, "")
    if expected.isdigit():
        return os.getppid() != int(expected)
    if os.getppid() != 1:
        return False
    try:
        with open("/proc/1/cmdline", "rb") as init:
            command = init.read()
    except OSError:
        return False
    return not any(name in command for name in LAUNCHERS)


def _exit_at_once(signum, frame) -> None:
    """The handler of ``guard_start``: the stop line while the command starts, then exit with ``STOP_STATUS``. After
    a run's handlers are put back (its outcome is decided) it just ends the process."""
    if _starting and LAUNCHED_ENV not in os.environ and os.environ.get("RANK", "0") == "0":
        resume = f"; resume with: {_resume_command(sys.argv[1:])}" if _resume_command else ""
        # Under someone else's launcher a peer's failure is also a stop: the launcher SIGTERMs the other processes.
        several = int(os.environ.get("WORLD_SIZE", "1")) > 1
        peer = "; if another process printed an error above, it stopped this one" if several else ""
        say(f"hf_grpo: stopped by a signal while starting, before training{peer}{resume}")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a terminal that is gone, a closed stream
            pass
    os._exit(STOP_STATUS)


def say(line: str) -> None:
    """Write ``line`` to stderr in one write. A terminal that is gone (SIGHUP: it was closed) takes nothing: the
    line is dropped, and stderr points at /dev/null from then on, so that exiting does not fail on it either."""
    try:
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()
    except OSError:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the rest of this process
