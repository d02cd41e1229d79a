"""A ``pebble.ProcessPool`` stand-in for ``hf_grpo.rewards.wrapper.RewardPool.map``, for ``benchmarks/rewards.py``.

Issue 10, item 6: could the 763 hand-written lines of the reward pool (then ``rewards/isolation.py``, now ``hf_grpo/base/workers.py``) be replaced by pebble, whose ``ProcessPool``
kills a task that runs past its timeout and starts a new worker? ``PebblePool.map(fn, items, timeout)`` has the same
contract as ``RewardPool.map``: ``fn(**item)`` per item in a worker, one ``Result`` per item in input order,
``"timeout"`` for an item that ran past ``timeout`` (its worker is killed and replaced by pebble), ``"error"`` for an
exception or a worker that died. Each item is one ``pool.schedule(fn, kwargs=item, timeout=timeout)``.

Workers start from the same preloaded "forkserver" context as ``RewardPool``'s (``PRELOAD``, plus pebble's own worker
module). Two initializers:

- ``stock_init``: what adopting pebble as it comes would use: ``warm_up`` (one MATH grade), nothing else;
- ``hardened_init``: ``warm_up`` plus what ``hf_grpo/base/workers.py`` does in its own workers and pebble does not:
  ``_die_with_parent`` (PR_SET_PDEATHSIG and closing the fork server's "alive" pipe, so that a worker stuck in C
  code dies when the training process is SIGKILLed) and the default SIGTERM action (pebble installs a Python
  SIGTERM handler in its workers, which cannot run while the worker is stuck in one C call, so pebble's kill of
  such a worker waits out its 3 s SIGTERM grace before it sends SIGKILL).

Both record whether the preloaded modules were already imported when the worker started (``worker_info``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError

from hf_grpo.base.workers import Result, _die_with_parent
from hf_grpo.rewards.functions import grade_completion
from hf_grpo.rewards.wrapper import PRELOAD, warm_up


PEBBLE_PRELOAD = [*PRELOAD, "pebble", "pebble.pool.process"]

# set in each worker by its initializer: were the preloaded modules there before the worker imported anything?
_PRELOADED_AT_START: bool | None = None


def _record_preload() -> None:
    global _PRELOADED_AT_START
    _PRELOADED_AT_START = all(module in sys.modules for module in PRELOAD)


def stock_init() -> None:
    """Initializer of a pebble pool used as it comes: one warm-up grade."""
    _record_preload()
    warm_up()


def hardened_init() -> None:
    """Initializer that adds ``workers.py``'s worker hardening to a pebble worker (see the module docstring)."""
    _record_preload()
    _die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    warm_up()


INITIALIZERS = {"stock": stock_init, "hardened": hardened_init}


# ---------------------------------------------------------------------------------------------------------------------
# Functions the benchmark runs in workers (module level, so that both pools can send them by reference)


def worker_info() -> dict:
    """Who ran this: pid, parent pid (the fork server), and whether the preload was in place at worker start."""
    return {"pid": os.getpid(), "ppid": os.getppid(), "preloaded": _PRELOADED_AT_START}


def graded_by(task: str, completion, gold: str) -> tuple[int, str]:
    """(pid of the worker, grade): ``grade_completion`` plus who ran it."""
    return os.getpid(), grade_completion(task, completion, gold)


def sleep_forever() -> None:
    """A Python-level hang: a signal handler can run (``time.sleep`` returns to the interpreter on a signal)."""
    while True:
        time.sleep(3600)


def c_loop_forever() -> int:
    """A C-level hang no Python signal handler can interrupt: ``sum`` over a ``range`` loops in C and never checks
    for signals (hours of work, constant memory)."""
    return sum(range(10**13))


# ---------------------------------------------------------------------------------------------------------------------
# The pool


def _is_pebble_timeout(exc: BaseException) -> bool:
    """pebble's own timeout (``TimeoutError("Task timeout", timeout)``), not a ``TimeoutError`` the function raised.

    Since Python 3.11 ``concurrent.futures.TimeoutError`` is the built-in ``TimeoutError``, so one that a reward
    raises itself (a socket or subprocess timeout) is told apart by the remote traceback pebble attaches to
    exceptions that come from a worker.
    """
    return (
        isinstance(exc, TimeoutError) and getattr(exc, "traceback", None) is None and exc.args[:1] == ("Task timeout",)
    )


class PebblePool:
    """``RewardPool``'s ``map`` / ``counters`` / ``worker_pids`` / ``close`` on top of ``pebble.ProcessPool``."""

    def __init__(self, num_workers: int, *, init: str = "stock", preload: Sequence[str] = PEBBLE_PRELOAD):
        self.num_workers = num_workers
        self.init = init
        self.counters: dict[str, dict[str, int]] = {}  # filled by the caller, as IsolatedReward fills RewardPool's
        import pebble  # here, so that the benchmark's functions above import without pebble installed

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))  # only takes effect if the fork server is not running yet
        self._pool = pebble.ProcessPool(max_workers=num_workers, context=ctx, initializer=INITIALIZERS[init])

    def map(self, fn: Callable, items: Sequence[dict], timeout: float) -> list[Result]:
        from pebble import ProcessExpired

        futures = [self._pool.schedule(fn, kwargs=item, timeout=timeout) for item in items]
        results = []
        for future in futures:
            try:
                value = future.result()
            except ProcessExpired as exc:
                results.append(Result("error", error=f"the worker process died (exit code {exc.exitcode})"))
            except CancelledError:
                results.append(Result("error", error="cancelled"))
            except BaseException as exc:  # noqa: BLE001 - the item's error, as RewardPool reports it
                if _is_pebble_timeout(exc):
                    results.append(Result("timeout", error=f"no result after {timeout:g} s; worker killed"))
                else:
                    text = str(exc)
                    name = type(exc).__name__
                    results.append(
                        Result(
                            "error",
                            error=f"{name}: {text}" if text else name,
                            traceback=getattr(exc, "traceback", None),
                        )
                    )
            else:
                results.append(Result("ok", value=value))
        return results

    @property
    def worker_pids(self) -> list[int]:
        """The current workers (pebble keeps them by pid in a private dict)."""
        return list(self._pool._pool_manager.worker_manager.workers)

    def close(self) -> None:
        """Stop the workers (pebble: SIGTERM, 3 s grace, SIGKILL) and the pool's three manager threads."""
        self._pool.stop()
        self._pool.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
