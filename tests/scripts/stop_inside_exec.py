"""Send this process a stop signal that lands where Python mishandles a KeyboardInterrupt, catch it as
``hf_grpo.train`` does and return 130 (0: the stop was lost). Run it with ``-m``: CPython's exit by SIGINT after an
"unhandled" KeyboardInterrupt is decided on that path.

    python -m tests.scripts.stop_inside_exec SIGTERM {exec,callback,bare-except} [--plain]

``exec``: inside an ``exec`` of a string (as while an import builds a dataclass). ``callback``: inside a weakref
callback (a module lock's, during an import), where Python prints and drops what is raised. ``bare-except``: inside
a library's ``except:`` (datasets' fingerprinting). After the last two the program reaches a safe point
(``hf_grpo.base.stopping.raise_if_stopped``), as training and evaluation do at every round and batch. ``--plain``: the
control, a handler raising a plain KeyboardInterrupt (nothing remembers it) and Python's own unraisable hook.
"""

from __future__ import annotations

import os
import signal
import sys
import weakref

from hf_grpo.base.stopping import handle_stop_signals, raise_if_stopped


class Thing:
    pass


def plain(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def wait_for_the_handler() -> None:
    for _ in range(10):  # the handler runs at a back-edge of this loop at the latest
        pass


def in_a_callback(signum: int) -> None:
    def callback(ref):
        os.kill(os.getpid(), signum)
        wait_for_the_handler()

    thing = Thing()
    ref = weakref.ref(thing, callback)
    del thing  # the callback runs now
    del ref


def in_a_bare_except(signum: int) -> None:
    try:
        os.kill(os.getpid(), signum)
        wait_for_the_handler()
    except:  # noqa: E722, S110 - what the library does
        pass


def main() -> int:
    signum, where = signal.Signals[sys.argv[1]], sys.argv[2]
    handle_stop_signals()
    if "--plain" in sys.argv:
        signal.signal(signum, plain)
        sys.unraisablehook = sys.__unraisablehook__
    try:
        if where == "exec":
            exec("import os\nos.kill(os.getpid(), SIGNUM)\nwhile True:\n    pass", {"SIGNUM": signum})  # noqa: S102
        else:
            (in_a_callback if where == "callback" else in_a_bare_except)(signum)
            raise_if_stopped()
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
