"""Fault-isolated rewards: a pool of warm worker processes with a hard per-completion timeout.

A reward can hang (math-verify on ``99999999999!`` computes for ever, as it did on huggingface/Math-Verify#65's
power tower before grading refused those, holding the GIL
so that no thread of the training process can stop it; other inputs can sit in one C call that not even a signal
handler interrupts) or raise. Run in-process, the first stalls training and the second
crashes it. Here each completion is scored in a long-lived worker process; a completion that takes longer than the
timeout gets no reward (``None``, which TRL skips) and its worker is killed and replaced; an exception becomes
``None`` plus a warning naming the reward. Both are counted per reward.

    >>> from hf_grpo.rewards.functions import math_correctness
    >>> pool = RewardPool(num_workers=2)                              # doctest: +SKIP
    >>> reward = isolate(math_correctness, pool, timeout=10.0)       # doctest: +SKIP
    >>> reward(completions=[r"\\boxed{2}"], solution=[r"\\boxed{2}"])  # doctest: +SKIP
    [1.0]
    >>> pool.counters                                                # doctest: +SKIP
    {'math_correctness': {'timeouts': 0, 'errors': 0}}
    >>> pool.close()                                                 # doctest: +SKIP

``hf_grpo.rewards.load_reward_funcs`` does this for every reward of a recipe (``reward_isolation``,
``reward_workers``, ``reward_timeout``).

Process model. ``RewardPool`` starts ``num_workers`` processes from a ``multiprocessing`` "forkserver" context (or
"spawn"), never by forking the training process, which holds torch threads. The fork server preloads this package,
math-verify and SymPy (and the main module, as the fork server does by default), so a worker, and a replacement
after a kill, starts in tens of milliseconds and grades its first completion without importing anything. A worker
runs an initializer (one MATH grade, to warm math-verify's lazy state) and then says it is ready.

Dispatch. ``RewardPool.map(fn, items, timeout)`` calls ``fn(**item)`` for each item in a worker and returns one
``Result`` per item, in input order. Items go out in small chunks (at most ``max_chunk``, a quarter of an even share
per worker), and a worker sends each item's result as soon as it has it, so the parent knows which item is running:
a worker's deadline is ``timeout`` after its previous result (or after the chunk was sent). The parent waits on all
workers' pipes and process sentinels with ``multiprocessing.connection.wait`` until the nearest deadline.

Timeout, kill, replace. When a deadline passes, the item being run is marked ``"timeout"``, the worker gets SIGTERM
(SIGKILL if it is still alive after a short grace), is joined (no zombie), and a new worker is started in its slot;
the rest of its chunk goes back to the front of the queue for the other workers. A worker that dies on its own
(segfault, ``os._exit``, the OOM killer) costs the item it was running an ``"error"`` result and is replaced the same
way. Workers that cannot even start (the initializer fails) raise ``RuntimeError`` from ``map`` after a few attempts,
since that is a broken setup, not a bad completion.

What crosses the process boundary. The function, pickled once per call (by reference: module and name, plus the
arguments of a ``functools.partial``), and each item's keyword arguments, pickled separately so that one item that
cannot be pickled is an error of its own. Back come the value, or ``(exception type, message, traceback)``.
``IsolatedReward`` sends one completion per item with the keyword arguments TRL passes, as single-element lists
(``prompts=[p]``, ``completions=[c]``, ``completion_ids=[ids]``, each dataset column ``[value]``), plus a snapshot of
``trainer_state`` without its log history and ``log_metric`` / ``log_extra`` proxies whose records come back with the
result and are replayed into the trainer's; ``environments`` (live objects) stay in the training process. A reward
that fails on every completion of ``max_failed_calls`` consecutive calls raises ``RewardFailedError``. The correctness rewards (``GRADED_REWARDS``) send
only the completion and its gold answer; the worker returns the grade and the parent maps grades to rewards and logs
``accuracy`` / ``grade/wrong`` / ``grade/unparseable`` over the completions that were graded (timeouts and errors are
left out of those fractions and counted instead).

A reward function must be importable by the workers: defined at module level in a module they can import (the
workers get the parent's ``sys.path`` and working directory), or a ``functools.partial`` of such a function. A
lambda, a function defined inside another function, or one typed into an interactive session cannot be sent;
``isolate`` raises ``RewardIsolationError`` naming the reward when it is set up, before training starts. Workers are
daemonic processes, so a reward cannot start ``multiprocessing`` children of its own (``subprocess`` is fine).
``async`` rewards are not isolated (``isolate`` refuses them; ``load_reward_funcs`` leaves them to TRL's event loop).

A new worker does not re-run the parent's main module (multiprocessing does by default) unless a reward is defined
there: under ``python -m hf_grpo.train`` that re-import of torch and TRL made each replacement after a timeout cost
2-12 s; it costs 0.1 s (``tests/test_reward_isolation.py::test_a_replacement_worker_does_not_rerun_the_main_module``).

Why not pebble (issue 10; ``python benchmarks/rewards.py --pool both``, pebble 5.2.3, 2 workers, a shared 2-core EPYC
at load 3-4, two runs). ``pebble.ProcessPool`` on the same preloaded forkserver context gives the same grades on 512
completions and starts and replaces workers about as fast (cold 0.9-1.8 s, warm 0.4-0.6 s, 0.12-0.29 s per
replacement; this pool 1.05-1.16 s, 0.4-0.6 s, 0.11-0.14 s), but reached 0.70-0.90x this pool's throughput (best of
5; about 0.1 ms more per item and twice the parent's CPU, from its manager threads), under the 10% bar. It also
breaks guarantees: a worker stuck in one C call ignores pebble's Python SIGTERM handler, so the kill lands 3.1 s
after the timeout (here 0.01 s); after a SIGKILLed parent the stuck worker, the fork server and the resource tracker
live on (here nothing does); and one worker dying while idle (the OOM killer) or one result the parent cannot
unpickle leaves the whole pool raising "Unexpected error within the Pool" for good (here: replaced, or that item's
error). An initializer of ours (``_die_with_parent``, SIGTERM's default action) repairs the first two, not the
third, and the wrapper, initializer and recovery would bring back much of the code pebble would save.

Each worker leads a process group of its own, and a killed worker's group is killed with it, so a subprocess a hung
reward started does not outlive it. A fork server that died (a reward killed its own parent) is started again at the
next worker start; the workers it had started die with it, and the items they were running count as errors.

Pools close at interpreter exit and when garbage-collected; ``close()`` is idempotent. On Linux a worker also dies
with the training process, even when that is SIGKILLed while the worker is stuck (``_die_with_parent``).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import functools
import importlib
import inspect
import logging
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import numbers
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
import weakref
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .functions import GRADED_REWARDS, grade_completion, log_grades
from .grading import GRADES, grade


logger = logging.getLogger(__name__)

# Keyword arguments of TRL's reward call that hold trainer objects. ``trainer_state`` goes to the workers as a snapshot
# (without its log history), ``log_metric`` / ``log_extra`` as recording proxies replayed into the trainer's;
# ``environments`` (live objects of the training process) are not sent.
NOT_SENT = ("trainer_state", "log_extra", "log_metric", "environments")
DEFAULT_MAX_FAILED_CALLS = 3

# Imported once by the fork server, so that every worker starts with them.
PRELOAD = (
    "hf_grpo.rewards",
    "hf_grpo.rewards.functions",
    "hf_grpo.rewards.grading",
    "hf_grpo.rewards.isolation",
    "sympy",
    "latex2sympy2_extended",
    "math_verify",
)

_KILL_GRACE_S = 0.5  # between SIGTERM and SIGKILL
_SHUTDOWN_GRACE_S = 2.0  # for a worker to leave after being asked to
_MAX_REPORTED_ERRORS = 20  # distinct errors logged per reward; more are only counted


class RewardIsolationError(ValueError):
    """A reward function cannot be run in a worker process (it cannot be sent to or loaded by one)."""


class RewardFailedError(RuntimeError):
    """A reward failed (raised or timed out) on every completion of several consecutive calls: a broken reward, not a
    hard completion. The message names the reward, its error and a sample input."""


@dataclass(frozen=True)
class Result:
    """The outcome of one item: ``status`` is ``"ok"`` (``value`` is set), ``"timeout"`` or ``"error"``."""

    status: str
    value: Any = None
    error: str | None = None  # "ValueError: message" for an error; what happened for a timeout
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def default_num_workers() -> int:
    """CPU cores available to this process, divided among the training processes of this machine (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)  # set by torchrun / accelerate launch
    return max(1, cores // max(1, local_processes))


def forkserver_preload() -> list[str]:
    """Modules the fork server imports: the main module (as multiprocessing does by default) and ``PRELOAD``.

    Under ``python -m package.module`` (``accelerate launch -m hf_grpo.train``) each new process re-runs the main
    module, so it is preloaded by name too and its imports are already there when a worker starts.
    """
    modules = ["__main__"]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    if name and name != "__main__" and not name.endswith(".__main__"):
        modules.append(name)
    return modules + list(PRELOAD)


def warm_up() -> None:
    """The default worker initializer: one MATH grade, so a worker's first real grade is as fast as the next."""
    grade("so $\\boxed{\\frac{1}{2}}$", "\\boxed{0.5}", "math")


# ---------------------------------------------------------------------------------------------------------------------
# Worker side


def _die_with_parent() -> None:
    """Make sure a worker never outlives the training process, even while stuck in C code that ignores signals.

    The kernel SIGKILLs the worker when its parent dies (Linux ``PR_SET_PDEATHSIG``). With "spawn" the parent is the
    training process. With "forkserver" it is the fork server, which exits once every holder of its "alive" pipe is
    gone; each process it starts inherits one end of that pipe, so the worker (which starts no processes) closes it,
    and then the training process's death ends the fork server, and the fork server's death ends the worker.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(alive_fd, int):
        with contextlib.suppress(OSError):
            os.close(alive_fd)
        server._forkserver_alive_fd = None
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)


def _describe(exc: BaseException) -> tuple[str, str, str]:
    """(type name, message, traceback without the worker loop's own frame) of an exception raised in a worker."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    return type(exc).__name__, str(exc), "".join(traceback.format_exception(type(exc), exc, tb))


def _worker_main(conn, preload: Sequence[str], initializer: Callable[[], None] | None) -> None:
    """A worker's life: import, warm up, say ready, then run chunks of items until told to stop or the pipe closes."""
    _die_with_parent()
    with contextlib.suppress(OSError):  # a group of its own: a reward's subprocesses are stopped with the worker
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's business; it closes the pool
    failed_imports = []
    for module in preload:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - sent to the parent, which logs it; the set-up check names the reward
            failed_imports.append(f"{module}: {type(exc).__name__}: {exc}")
    if initializer is not None:
        try:
            initializer()
        except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it if no worker can start
            conn.send(("init_error", "".join(traceback.format_exception(exc))))
            return
    conn.send(("ready", os.getpid(), failed_imports))

    fn_blob, fn, load_error = None, None, None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if message is None:
            return
        task_ids, blob, item_blobs = message
        if blob != fn_blob:
            fn_blob, fn, load_error = blob, None, None
            try:
                fn = pickle.loads(blob)
            except BaseException as exc:  # noqa: BLE001 - sent to the parent as every item's error
                name, text, tb = _describe(exc)
                load_error = (f"cannot load the function in a worker: {name}", text, tb)
        for task_id, item_blob in zip(task_ids, item_blobs, strict=True):
            if load_error is not None:
                reply = ("result", task_id, False, load_error)
            else:
                try:
                    value = fn(**pickle.loads(item_blob))
                except BaseException as exc:  # noqa: BLE001 - sent to the parent, which logs it by name and counts it
                    reply = ("result", task_id, False, _describe(exc))
                else:
                    reply = ("result", task_id, True, value)
            try:
                try:
                    conn.send(reply)
                except (pickle.PicklingError, TypeError, AttributeError) as exc:
                    error = (f"result cannot be sent back: {type(exc).__name__}", str(exc), "")
                    conn.send(("result", task_id, False, error))
            except OSError:  # the parent is gone
                return


# ---------------------------------------------------------------------------------------------------------------------
# Parent side


@contextlib.contextmanager
def _main_module_hidden(hide: bool):
    """While a worker starts, show multiprocessing a bare ``__main__`` (no spec, no file) unless a reward lives there.

    multiprocessing re-runs the parent's main module in every new process (``spawn.prepare``): under ``python -m
    hf_grpo.train`` that is torch, transformers and TRL, about 2 s per worker (9 s on a loaded machine) instead of
    0.1 s, paid again for every replacement after a timeout. The window is the ``Process.start`` call."""
    if not hide:
        yield
        return
    real = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real


class _Worker:
    """One worker process as the parent sees it: its pipe, the task ids it is running and its deadline."""

    def __init__(self, ctx, slot: int, preload: Sequence[str], initializer):
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_worker_main,
            args=(child_conn, list(preload), initializer),
            name=f"hf_grpo-reward-worker-{slot}",
            daemon=True,
        )
        self.process.start()
        child_conn.close()
        self.conn = parent_conn
        self.pid = self.process.pid
        self.slot = slot
        self.ready = False
        self.started = time.monotonic()
        self.tasks: deque[int] = deque()  # item indices sent and not answered, in the order the worker runs them
        self.deadline: float | None = None

    def stop(self, grace: float = _KILL_GRACE_S) -> None:
        """Terminate (then kill) the process, reap it and close the pipe."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(grace)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10.0)
        with contextlib.suppress(OSError):  # what the reward started (a hung `subprocess` child, say) goes too
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.conn.close()


def _shutdown(workers: list[_Worker], owner: int) -> None:
    """Ask every worker to leave, wait a little, then terminate / kill and reap the rest."""
    if os.getpid() != owner:  # a forked copy of the training process (a DataLoader worker): not its workers
        return
    for w in workers:
        with contextlib.suppress(OSError, ValueError):
            w.conn.send(None)
    end = time.monotonic() + _SHUTDOWN_GRACE_S
    for w in workers:
        w.process.join(max(0.0, end - time.monotonic()))
        w.stop()
    workers.clear()


class RewardPool:
    """A pool of warm worker processes that runs function calls with a hard per-item timeout.

    Args:
        num_workers (`int`, *optional*):
            Worker processes; defaults to ``default_num_workers()``.
        start_method (`str`, defaults to `"forkserver"`):
            ``"forkserver"`` (fast starts and replacements, preloaded imports) or ``"spawn"`` (a fresh interpreter
            per worker). Plain ``"fork"`` is refused: it would copy the training process and its threads.
        preload (`Sequence[str]`, *optional*):
            Extra modules each worker imports before it is ready (e.g. the modules of user reward functions).
        initializer (`Callable`, *optional*, defaults to `warm_up`):
            Called once in each worker before it is ready. Must be importable by name.
        startup_timeout (`float`, defaults to `120.0`):
            Seconds a worker may take to become ready before it is killed and started again.
        max_chunk (`int`, defaults to `16`):
            Most items sent to a worker at once.

    ``counters`` holds cumulative ``{"timeouts": n, "errors": n}`` per reward name (filled by ``IsolatedReward``);
    ``worker_pids`` the current workers; ``started_workers`` how many processes were started in all (so
    ``started_workers - num_workers`` were replacements).
    """

    def __init__(
        self,
        num_workers: int | None = None,
        *,
        start_method: str = "forkserver",
        preload: Sequence[str] = (),
        initializer: Callable[[], None] | None = warm_up,
        startup_timeout: float = 120.0,
        max_chunk: int = 16,
    ):
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
        self.num_workers = default_num_workers() if num_workers is None else int(num_workers)
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.start_method = start_method
        self.startup_timeout = startup_timeout
        self.max_chunk = max(1, max_chunk)
        self.counters: dict[str, dict[str, int]] = {}
        self.started_workers = 0
        self._preload = list(PRELOAD) + [m for m in preload if m not in PRELOAD and m != "__main__"]
        self._initializer = initializer
        self._ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            # The main module (e.g. hf_grpo.train, which imports trl) costs seconds to import: only preload it when a
            # reward is defined there. Only takes effect if the fork server is not running yet.
            self._ctx.set_forkserver_preload(forkserver_preload() if "__main__" in preload else list(PRELOAD))
        self._needs_main = "__main__" in preload
        self._lock = threading.RLock()
        self._next_id = 0
        self._start_failures = 0
        self._last_start_error = ""
        self._reported_imports: set[str] = set()
        self._workers: list[_Worker] = []
        self._closed = False
        self._owner = os.getpid()
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._owner)  # also at interpreter exit
        for slot in range(self.num_workers):
            self._workers.append(self._start(slot))

    # ---- lifecycle

    def _start(self, slot: int) -> _Worker:
        self.started_workers += 1
        with _main_module_hidden(not self._needs_main):
            try:
                return _Worker(self._ctx, slot, self._preload, self._initializer)
            except (EOFError, ConnectionError) as exc:  # the fork server died (a reward killed its parent, say)
                if self.start_method != "forkserver":
                    raise
                logger.warning("the reward workers' fork server is gone (%s): starting a new one", exc)
                multiprocessing.forkserver._forkserver._stop()
                return _Worker(self._ctx, slot, self._preload, self._initializer)

    def _replace(self, w: _Worker) -> None:
        w.stop()
        self._workers[w.slot] = self._start(w.slot)

    @property
    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop every worker and reap it. Safe to call twice; also runs at interpreter exit."""
        with self._lock:
            self._closed = True
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.num_workers} {self.start_method} workers"
        return f"RewardPool({state})"

    # ---- running

    def map(self, fn: Callable, items: Sequence[dict], timeout: float) -> list[Result]:
        """Call ``fn(**item)`` for every item in the workers; one ``Result`` per item, in order.

        An item that runs longer than ``timeout`` seconds is a ``"timeout"`` (its worker is killed and replaced),
        one that raises (or whose inputs cannot be pickled) an ``"error"``. ``fn`` itself must be picklable by
        reference (``pickle.PicklingError`` otherwise).
        """
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        fn_blob = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self._closed:
                raise RuntimeError("this RewardPool is closed")
            if os.getpid() != self._owner:
                raise RuntimeError("a RewardPool can only be used by the process that created it")
            results: list[Result | None] = [None] * len(items)
            blobs: dict[int, bytes] = {}
            for i, item in enumerate(items):
                try:
                    blobs[i] = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
                except (pickle.PicklingError, TypeError, AttributeError) as exc:
                    results[i] = Result(
                        "error", error=f"inputs cannot be sent to a worker: {type(exc).__name__}: {exc}"
                    )
            base, self._next_id = self._next_id, self._next_id + len(items)
            try:
                self._run(fn_blob, blobs, base, results, timeout)
            except BaseException:
                # Interrupted (Ctrl-C) or no worker can start: work in flight is abandoned with its workers.
                for w in list(self._workers):
                    if w.tasks:
                        self._replace(w)
                raise
            return results  # type: ignore[return-value]

    def _run(self, fn_blob: bytes, blobs: dict[int, bytes], base: int, results: list, timeout: float) -> None:
        pending = deque(sorted(blobs))
        chunk = max(1, min(self.max_chunk, math.ceil(len(pending) / (4 * self.num_workers))))
        while pending or any(w.tasks for w in self._workers):
            for w in list(self._workers):
                if pending and w.ready and not w.tasks:
                    ids = [pending.popleft() for _ in range(min(chunk, len(pending)))]
                    try:
                        w.conn.send(([base + i for i in ids], fn_blob, [blobs[i] for i in ids]))
                    except OSError:  # it died while idle; its death is handled below
                        pending.extendleft(reversed(ids))
                        continue
                    w.tasks.extend(ids)
                    w.deadline = time.monotonic() + timeout

            now = time.monotonic()
            deadlines = [w.deadline for w in self._workers if w.tasks]
            deadlines += [w.started + self.startup_timeout for w in self._workers if not w.ready]
            wait_s = max(0.0, min(deadlines) - now) if deadlines else None
            waitables = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
            ready = set(multiprocessing.connection.wait(waitables, wait_s))

            for w in list(self._workers):
                alive = self._drain(w, base, results, timeout) if w.conn in ready else True
                if not alive or w.process.sentinel in ready:
                    if alive:
                        self._drain(w, base, results, timeout)  # what it said before it exited
                    self._on_exit(w, results, pending)

            now = time.monotonic()
            for w in list(self._workers):
                if w.tasks and w.deadline <= now:
                    if not self._drain(w, base, results, timeout):  # a result may have just arrived
                        self._on_exit(w, results, pending)
                    elif w.tasks and w.deadline <= now:
                        self._on_timeout(w, results, pending, timeout)
                elif not w.ready and now - w.started > self.startup_timeout:
                    self._last_start_error = f"not ready after {self.startup_timeout:.0f} s"
                    self._start_failed(w)

    def _drain(self, w: _Worker, base: int, results: list, timeout: float) -> bool:
        """Read everything a worker has sent; False when its pipe is closed (the worker is gone)."""
        while True:
            try:
                if not w.conn.poll():
                    return True
                message = w.conn.recv()
            except (EOFError, OSError):
                return False
            except (pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError) as exc:
                # a result the parent cannot unpickle (the bytes were read, the pipe is intact) is that item's error
                if w.tasks:
                    results[w.tasks.popleft()] = Result("error", error=f"result cannot be read: {exc!r}")
                    w.deadline = time.monotonic() + timeout
                continue
            kind = message[0]
            if kind == "result":
                _, task_id, ok, payload = message
                if not w.tasks or w.tasks[0] != task_id - base:
                    continue  # left over from an interrupted call
                index = w.tasks.popleft()
                if ok:
                    results[index] = Result("ok", value=payload)
                else:
                    name, text, tb = payload
                    results[index] = Result("error", error=f"{name}: {text}" if text else name, traceback=tb)
                w.deadline = time.monotonic() + timeout if w.tasks else None
            elif kind == "ready":
                w.ready = True
                self._start_failures = 0
                for failure in message[2]:
                    if failure not in self._reported_imports:
                        self._reported_imports.add(failure)
                        logger.warning("reward worker could not preload %s", failure)
            elif kind == "init_error":
                self._last_start_error = message[1]

    def _on_timeout(self, w: _Worker, results: list, pending: deque, timeout: float) -> None:
        index = w.tasks.popleft()
        results[index] = Result("timeout", error=f"no result after {timeout:g} s; worker {w.pid} killed")
        pending.extendleft(reversed(w.tasks))
        w.tasks.clear()
        self._replace(w)

    def _on_exit(self, w: _Worker, results: list, pending: deque) -> None:
        w.process.join(_KILL_GRACE_S)
        code = w.process.exitcode
        if w.tasks:
            results[w.tasks.popleft()] = Result("error", error=f"the worker process died (exit code {code})")
            pending.extendleft(reversed(w.tasks))
            w.tasks.clear()
            self._replace(w)
        elif not w.ready:
            if not self._last_start_error:
                self._last_start_error = f"exit code {code}"
            self._start_failed(w)
        else:
            self._replace(w)

    def _start_failed(self, w: _Worker) -> None:
        self._start_failures += 1
        if self._start_failures > 3 * self.num_workers:
            w.stop()
            raise RuntimeError(f"reward worker processes fail to start: {self._last_start_error.strip()}")
        self._replace(w)


# ---------------------------------------------------------------------------------------------------------------------
# Rewards


def _score_one(reward_fn: Callable, context: dict, /, **kwargs) -> tuple[float | None, dict, dict]:
    """Worker side of ``IsolatedReward``: call the reward on one completion as TRL calls it (``context`` holds the
    ``trainer_state`` copy), with ``log_metric`` / ``log_extra`` recording what it logs; check it returned one number
    or None. Returns the reward and the recorded ``{metric: [values]}`` and ``{column: [values]}``."""
    metrics, extras = defaultdict(list), defaultdict(list)

    def log_metric(name: str, value: float) -> None:
        metrics[name].append(float(value))

    def log_extra(column: str, values: list) -> None:
        extras[column].extend(values)

    out = reward_fn(**context, **kwargs, log_metric=log_metric, log_extra=log_extra)
    if not isinstance(out, (list, tuple)) or len(out) != 1:
        raise TypeError(f"a reward function must return a list with one reward per completion, got {out!r:.200}")
    value = out[0]
    if value is not None and not isinstance(value, numbers.Real):
        raise TypeError(f"a reward must be a number or None, got {type(value).__name__} {value!r:.200}")
    return (None if value is None else float(value)), dict(metrics), dict(extras)


def state_snapshot(state) -> types.SimpleNamespace:
    """What an isolated reward gets as ``trainer_state``: the attributes of TRL's ``TrainerState`` (``global_step``,
    ``max_steps``, ``epoch``, ...) in a plain namespace, without ``log_history``, which grows with the run. A worker
    unpickles it without importing transformers (seconds per replacement worker otherwise)."""
    if dataclasses.is_dataclass(state):
        fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    else:
        fields = dict(getattr(state, "__dict__", {}))
    return types.SimpleNamespace(**{k: copy.deepcopy(v) for k, v in fields.items() if k != "log_history"})


def _loads(blob: bytes) -> bool:
    """Worker side of the set-up check: the function can be unpickled (its module imported) in a worker."""
    pickle.loads(blob)
    return True


def _unwrap(fn: Callable) -> Callable:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _snippet(value: Any, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class IsolatedReward:
    """A reward function run in a ``RewardPool``, callable the way TRL calls reward functions.

    Each completion is scored on its own in a worker with the keyword arguments TRL passes, cut to that completion:
    ``prompts=[p]``, ``completions=[c]``, ``completion_ids=[ids]``, ``{column: [value]}`` for every dataset column,
    ``trainer_state`` (``state_snapshot``: its attributes without ``log_history``), and ``log_metric`` / ``log_extra`` proxies. What the reward
    logs comes back with its result and reaches the trainer: per call, each metric's values averaged over the
    completions (one ``log_metric`` call, as a batch-level reward makes), each extra column with one value per
    completion (None for a completion that failed). ``environments`` stays in the training process.

    A timeout or an exception gives ``None``. Per call, ``rewards/<name>/timeouts`` and ``rewards/<name>/errors`` go
    to TRL's ``log_metric``; cumulative counts are in ``pool.counters[name]``. Each distinct error is logged once as a
    warning naming the reward, the first timeout too. When every completion of ``max_failed_calls`` consecutive calls
    fails, the reward is broken (a wrong signature, a missing column), and the call raises ``RewardFailedError``.

    Build it with ``isolate``, which checks at set-up time that a worker can load the function.
    """

    def __init__(
        self,
        fn: Callable,
        pool: RewardPool,
        name: str,
        timeout: float,
        max_failed_calls: int = DEFAULT_MAX_FAILED_CALLS,
    ):
        if not timeout > 0:
            raise ValueError(f"reward timeout must be positive, got {timeout}")
        if max_failed_calls < 1:
            raise ValueError(f"max_failed_calls must be at least 1, got {max_failed_calls}")
        self.fn = fn
        self.pool = pool
        self.timeout = float(timeout)
        self.max_failed_calls = max_failed_calls
        self.__name__ = name
        self.__qualname__ = name
        self.__doc__ = getattr(_unwrap(fn), "__doc__", None)
        self._reported: set[str] = set()
        self._warned_timeout = False
        self._failed_calls = 0
        self.last_nan = 0  # NaN rewards the function returned in the last call
        pool.counters.setdefault(name, {"timeouts": 0, "errors": 0})

    def __repr__(self) -> str:
        return f"IsolatedReward({self.__name__!r}, timeout={self.timeout:g}, {self.pool!r})"

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float | None]:
        columns = {k: v for k, v in kwargs.items() if k not in NOT_SENT}
        n = len(completions)
        per_item = {k: v for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) == n}
        shared = {k: v for k, v in columns.items() if k not in per_item}  # passed whole to every call
        items = []
        for i in range(n):
            item = {"completions": [completions[i]], **shared, **{k: [v[i]] for k, v in per_item.items()}}
            if prompts is not None:
                item["prompts"] = [prompts[i]]
            if completion_ids is not None:
                item["completion_ids"] = [completion_ids[i]]
            items.append(item)
        context = {}
        if kwargs.get("trainer_state") is not None:
            context["trainer_state"] = state_snapshot(kwargs["trainer_state"])
        results = self.pool.map(functools.partial(_score_one, self.fn, context), items, self.timeout)
        self._account(results, completions, kwargs.get("log_metric"), sample=items[0] if items else None)
        self._replay([r.value if r.ok else None for r in results], kwargs.get("log_metric"), kwargs.get("log_extra"))
        rewards = [r.value[0] if r.ok else None for r in results]
        nan = [i for i, value in enumerate(rewards) if value is not None and math.isnan(value)]
        self.last_nan = len(nan)  # the trainer counts them in rewards/<name>/nonfinite (after TRL, NaN is None)
        for i in nan:
            rewards[i] = None
        return rewards

    @staticmethod
    def _replay(outputs: list, log_metric, log_extra) -> None:
        """Pass what the reward logged in the workers to the trainer's ``log_metric`` / ``log_extra``."""
        done = [out for out in outputs if out is not None]
        if log_metric is not None:
            names = dict.fromkeys(name for _, metrics, _ in done for name in metrics)
            for name in names:
                values = [v for _, metrics, _ in done for v in metrics.get(name, ())]
                log_metric(name, sum(values) / len(values))
        if log_extra is not None:
            for column in dict.fromkeys(column for _, _, extras in done for column in extras):
                values = []
                for out in outputs:
                    values.extend(out[2].get(column, [None]) if out is not None else [None])
                log_extra(column, values)

    def _account(self, results: list[Result], completions, log_metric, sample: dict | None = None) -> None:
        """Count and report this call's timeouts and errors; raise RewardFailedError for a reward that always fails."""
        timeouts = sum(r.status == "timeout" for r in results)
        errors = sum(r.status == "error" for r in results)
        counters = self.pool.counters.setdefault(self.__name__, {"timeouts": 0, "errors": 0})
        counters["timeouts"] += timeouts
        counters["errors"] += errors
        for result, completion in zip(results, completions, strict=True):
            if result.status == "timeout" and not self._warned_timeout:
                self._warned_timeout = True
                logger.warning(
                    "reward %r timed out after %g s on completion %s: it gets no reward, the worker was killed and "
                    "replaced; further timeouts are counted in rewards/%s/timeouts",
                    self.__name__,
                    self.timeout,
                    _snippet(completion),
                    self.__name__,
                )
            elif result.status == "error":
                self._report(result, completion)
        if log_metric is not None:
            log_metric(f"rewards/{self.__name__}/timeouts", float(timeouts))
            log_metric(f"rewards/{self.__name__}/errors", float(errors))
        self._failed_calls = self._failed_calls + 1 if results and timeouts + errors == len(results) else 0
        if self._failed_calls >= self.max_failed_calls:
            last = results[-1]
            what = last.error if last.status == "error" else f"timed out after {self.timeout:g} s"
            inputs = ", ".join(f"{k}={_snippet(v, 80)}" for k, v in (sample or {}).items())
            raise RewardFailedError(
                f"reward {self.__name__!r} failed on every completion of {self._failed_calls} consecutive calls "
                f"({self.max_failed_calls} allowed: reward_max_failed_calls): {what}. A sample input: {inputs}. "
                "TRL calls a reward with prompts, completions, completion_ids, trainer_state, log_metric, log_extra "
                "and every dataset column as keywords: accept the ones you use and **kwargs"
            )

    def _report(self, result: Result, completion) -> None:
        """Log an error once per distinct message (at most ``_MAX_REPORTED_ERRORS`` of them per reward)."""
        key = result.error or ""
        if key in self._reported or len(self._reported) >= _MAX_REPORTED_ERRORS:
            return
        self._reported.add(key)
        more = (
            f"; this is the last of {_MAX_REPORTED_ERRORS} distinct errors logged for this reward, more are only counted"
            if len(self._reported) == _MAX_REPORTED_ERRORS
            else ""
        )
        logger.warning(
            "reward %r failed on completion %s: %s; it gets no reward (counted in rewards/%s/errors)%s%s",
            self.__name__,
            _snippet(completion),
            result.error,
            self.__name__,
            more,
            f"\n{result.traceback.rstrip()}" if result.traceback else "",
        )


class IsolatedCorrectness(IsolatedReward):
    """A correctness reward (``GRADED_REWARDS``) run in a pool: workers grade, the parent turns grades into rewards.

    It logs ``accuracy`` and ``grade/wrong`` / ``grade/unparseable`` like the in-process function, over the
    completions that were graded.
    """

    def __init__(self, fn: Callable, pool: RewardPool, name: str, timeout: float, **kwargs):
        self.task = GRADED_REWARDS[_unwrap(fn)]
        super().__init__(fn, pool, name, timeout, **kwargs)

    def __call__(self, completions, solution, log_metric=None, **kwargs) -> list[float | None]:
        if len(solution) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(solution)} solutions")
        items = [{"completion": c, "gold": gold} for c, gold in zip(completions, solution, strict=True)]
        results = self.pool.map(functools.partial(grade_completion, self.task), items, self.timeout)
        checked = [
            r if not r.ok or r.value in GRADES else Result("error", error=f"ValueError: unknown grade {r.value!r}")
            for r in results
        ]
        self._account(checked, completions, log_metric, sample=items[0] if items else None)
        grades = [r.value for r in checked if r.ok]
        log_grades(grades, log_metric)
        return [(1.0 if r.value == "correct" else 0.0) if r.ok else None for r in checked]


def is_async(fn: Callable) -> bool:
    """Whether calling ``fn`` (a function, a partial of one, or a callable object) returns a coroutine."""
    base = _unwrap(fn)
    return inspect.iscoroutinefunction(base) or inspect.iscoroutinefunction(type(base).__call__)


def isolate(
    fn: Callable,
    pool: RewardPool,
    name: str | None = None,
    timeout: float = 10.0,
    max_failed_calls: int = DEFAULT_MAX_FAILED_CALLS,
) -> IsolatedReward:
    """Wrap a reward function to run in ``pool``; ``RewardIsolationError`` (naming it) if a worker cannot load it.

    The built-in correctness rewards (also as a ``functools.partial``) become an ``IsolatedCorrectness``, any other
    function an ``IsolatedReward``.
    """
    base = _unwrap(fn)
    name = name or getattr(fn, "__name__", None) or getattr(base, "__name__", repr(fn))
    if is_async(fn):
        raise RewardIsolationError(
            f"reward {name!r} is async; async rewards run in the training process, as TRL runs them"
        )
    main = sys.modules.get("__main__")
    if getattr(base, "__module__", None) == "__main__" and not (
        getattr(main, "__file__", None) or getattr(main, "__spec__", None)
    ):
        raise RewardIsolationError(
            f"reward {name!r} is defined in an interactive session, which worker processes cannot import; move it to "
            "a module (or set reward_isolation: false)"
        )
    try:
        blob = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise RewardIsolationError(
            f"reward {name!r} cannot be sent to a worker process ({type(exc).__name__}: {exc}); a lambda, a function "
            "defined inside another function or an object holding one cannot: define it at module level in an "
            "importable module (a functools.partial of it works too), or set reward_isolation: false"
        ) from exc
    (check,) = pool.map(_loads, [{"blob": blob}], timeout=max(60.0, timeout))
    if not check.ok:
        raise RewardIsolationError(f"reward {name!r} cannot be loaded in a worker process: {check.error}")
    cls = IsolatedCorrectness if base in GRADED_REWARDS else IsolatedReward
    return cls(fn, pool, name=name, timeout=timeout, max_failed_calls=max_failed_calls)


def reward_modules(fns: Sequence[Callable]) -> list[str]:
    """The modules defining ``fns`` (partials unwrapped), for ``RewardPool(preload=...)``; ``"__main__"`` makes the
    fork server import the main module too."""
    modules = []
    for fn in fns:
        module = getattr(_unwrap(fn), "__module__", None)
        if module and module not in modules:
            modules.append(module)
    return modules


__all__ = [
    "NOT_SENT",
    "IsolatedCorrectness",
    "IsolatedReward",
    "Result",
    "RewardFailedError",
    "RewardIsolationError",
    "RewardPool",
    "default_num_workers",
    "is_async",
    "isolate",
    "reward_modules",
]
