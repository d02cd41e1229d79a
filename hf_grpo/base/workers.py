"""A pool of warm worker processes that runs calls of any picklable function with a hard per-item timeout.

    >>> with WorkerPool(num_workers=2) as pool:                        # doctest: +SKIP
    ...     pool.map(pow, [{"base": 2, "exp": 10}, {"base": 10, "exp": 10**10}], timeout=1.0)
    [Result(status='ok', value=1024, ...), Result(status='timeout', ...)]

``map(fn, items, timeout)`` returns one ``Result`` per item, in order: ``"ok"``, ``"timeout"`` (the worker is killed
and replaced) or ``"error"``. Rewards (``hf_grpo.rewards.wrapper``) and evaluation grading run in it; it knows
nothing of either. Design and measurements: docs/reward_workers.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


logger = logging.getLogger(__name__)

_KILL_GRACE_S = 0.5  # between SIGTERM and SIGKILL
_SHUTDOWN_GRACE_S = 2.0  # for a worker to leave after being asked to


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


def cores_per_process() -> int:
    """CPU cores available to this process, divided among the training processes of this machine (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)  # set by torchrun / accelerate launch
    return max(1, cores // max(1, local_processes))


def forkserver_preload(preload: Sequence[str]) -> list[str]:
    """Modules the fork server imports: the main module (as multiprocessing does by default), then ``preload``.

    Under ``python -m package.module`` (``accelerate launch -m hf_grpo.train``) each new process re-runs the main
    module, so it is preloaded by name too and its imports are already there when a worker starts.
    """
    modules = ["__main__"]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    if name and name != "__main__" and not name.endswith(".__main__"):
        modules.append(name)
    return modules + list(preload)


# ---------------------------------------------------------------------------------------------------------------------
# Worker side


def _die_with_parent() -> None:
    """Make sure a worker never outlives the caller, even while stuck in C code that ignores signals: the kernel
    SIGKILLs it when its parent (the fork server, or the caller under "spawn") dies, and it closes its end of the fork
    server's "alive" pipe, so that the caller's death ends the fork server (see ``docs/reward_workers.md``)."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
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
    with contextlib.suppress(OSError):  # a group of its own: fn's subprocesses are stopped with the worker
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's business; it closes the pool
    failed_imports = []
    for module in preload:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - sent to the parent, which logs it
            failed_imports.append(f"{module}: {type(exc).__name__}: {exc}")
    if initializer is not None:
        try:
            initializer()
        except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it if no worker can start
            with contextlib.suppress(OSError):  # the parent is gone
                conn.send(("init_error", "".join(traceback.format_exception(exc))))
            return
    try:
        conn.send(("ready", os.getpid(), failed_imports))
    except OSError:  # the parent closed the pool (a stop signal) while this worker started: nothing to say
        return

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
def _main_module_hidden():
    """During ``Process.start``, show multiprocessing a bare ``__main__`` (no spec, no file) unless fn lives there:
    otherwise every new worker re-runs the caller's main module (``spawn.prepare``), seconds for ``hf_grpo.train``."""
    real = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = real


@contextlib.contextmanager
def _sigint_held():
    """SIGINT blocked in this thread while a process starts. A fresh interpreter started meanwhile (the fork server,
    a "spawn" worker) inherits the mask, so a Ctrl-C to the process group while it initializes, before it ignores
    SIGINT, stays pending instead of killing it with "Fatal Python error: init_sys_streams" and a traceback on the
    run's console (CPython's resource tracker starts the same way). This thread gets a SIGINT when it is unblocked."""
    multiprocessing.resource_tracker.ensure_running()  # first: starting, it unblocks SIGINT instead of restoring
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


class _Worker:
    """One worker process as the parent sees it: its pipe, the task ids it is running and its deadline."""

    def __init__(self, ctx, name: str, slot: int, preload: Sequence[str], initializer):
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(
            target=_worker_main,
            args=(child_conn, list(preload), initializer),
            name=f"hf_grpo-{name}-worker-{slot}",
            daemon=True,
        )
        with _sigint_held():
            self.process.start()
        child_conn.close()
        self.conn = parent_conn
        self.pid = self.process.pid
        self.slot = slot
        self.ready = False
        self.started = time.monotonic()
        self.tasks: deque[int] = deque()  # item indices sent and not answered, in the order the worker runs them
        self.deadline: float | None = None

    def stop(self) -> None:
        """Terminate (then kill) the process, reap it and close the pipe."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(_KILL_GRACE_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10.0)
        with contextlib.suppress(OSError):  # what fn started (a hung `subprocess` child, say) goes too
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


class WorkerPool:
    """A pool of warm worker processes that runs function calls with a hard per-item timeout.

    Args:
        num_workers (`int`, *optional*):
            Worker processes; defaults to ``cores_per_process()``.
        start_method (`str`, defaults to `"forkserver"`):
            ``"forkserver"`` (fast starts and replacements, preloaded imports) or ``"spawn"`` (a fresh interpreter
            per worker). Plain ``"fork"`` is refused: it would copy the calling process and its threads.
        server_preload (`Sequence[str]`, *optional*):
            Modules the fork server imports once (if this pool starts it), so every worker starts with them.
        preload (`Sequence[str]`, *optional*):
            Extra modules each worker imports before it is ready (e.g. the modules of user functions);
            ``"__main__"`` makes the fork server import the main module too.
        initializer (`Callable`, *optional*):
            Called once in each worker before it is ready. Must be importable by name.
        startup_timeout (`float`, defaults to `120.0`):
            Seconds a worker may take to become ready before it is killed and started again.
        max_chunk (`int`, defaults to `16`):
            Most items sent to a worker at once.
        name (`str`, defaults to `"worker"`):
            What the workers are for, in process names and messages (``"reward"``: ``hf_grpo-reward-worker-0``).

    ``worker_pids`` are the current workers; ``started_workers`` how many processes were started in all (so
    ``started_workers - num_workers`` were replacements); ``closed`` is set by ``close``.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        *,
        start_method: str = "forkserver",
        server_preload: Sequence[str] = (),
        preload: Sequence[str] = (),
        initializer: Callable[[], None] | None = None,
        startup_timeout: float = 120.0,
        max_chunk: int = 16,
        name: str = "worker",
    ):
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
        self.num_workers = cores_per_process() if num_workers is None else int(num_workers)
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.start_method = start_method
        self.startup_timeout = startup_timeout
        self.max_chunk = max(1, max_chunk)
        self.name = name
        self.started_workers = 0
        self._preload = list(server_preload) + [m for m in preload if m not in server_preload and m != "__main__"]
        self._initializer = initializer
        self._ctx = multiprocessing.get_context(start_method)
        self._needs_main = "__main__" in preload
        if start_method == "forkserver":
            # The main module (e.g. hf_grpo.train, which imports trl) costs seconds to import: only preload it when a
            # function is defined there. Only takes effect if the fork server is not running yet.
            server = forkserver_preload(server_preload) if self._needs_main else list(server_preload)
            self._ctx.set_forkserver_preload(server)
        self._lock = threading.RLock()
        self._next_id = 0
        self._start_failures = 0
        self._last_start_error = ""
        self._reported_imports: set[str] = set()
        self._workers: list[_Worker] = []
        self.closed = False
        self._owner = os.getpid()
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._owner)  # also at interpreter exit
        for slot in range(self.num_workers):
            self._workers.append(self._start(slot))

    # ---- lifecycle

    def _start(self, slot: int) -> _Worker:
        self.started_workers += 1
        with contextlib.nullcontext() if self._needs_main else _main_module_hidden():
            try:
                return _Worker(self._ctx, self.name, slot, self._preload, self._initializer)
            except (EOFError, ConnectionError) as exc:  # the fork server died (fn killed its parent, say)
                if self.start_method != "forkserver":
                    raise
                logger.warning("the %s workers' fork server is gone (%s): starting a new one", self.name, exc)
                multiprocessing.forkserver._forkserver._stop()
                return _Worker(self._ctx, self.name, slot, self._preload, self._initializer)

    def _replace(self, w: _Worker) -> None:
        w.stop()
        self._workers[w.slot] = self._start(w.slot)

    @property
    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    def close(self) -> None:
        """Stop every worker and reap it. Safe to call twice; also runs at interpreter exit."""
        with self._lock:
            self.closed = True
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.num_workers} {self.start_method} workers"
        return f"{type(self).__name__}({state})"

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
            if self.closed:
                raise RuntimeError(f"this {type(self).__name__} is closed")
            if os.getpid() != self._owner:
                raise RuntimeError(f"a {type(self).__name__} can only be used by the process that created it")
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
                        timed_out = Result("timeout", error=f"no result after {timeout:g} s; worker {w.pid} killed")
                        self._fail_first(w, results, pending, timed_out)
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
                        logger.warning("%s worker could not preload %s", self.name, failure)
            elif kind == "init_error":
                self._last_start_error = message[1]

    def _fail_first(self, w: _Worker, results: list, pending: deque, result: Result) -> None:
        """``result`` for the item the worker is running; its other items go back to ``pending``; it is replaced."""
        results[w.tasks.popleft()] = result
        pending.extendleft(reversed(w.tasks))
        w.tasks.clear()
        self._replace(w)

    def _on_exit(self, w: _Worker, results: list, pending: deque) -> None:
        w.process.join(_KILL_GRACE_S)
        code = w.process.exitcode
        if w.tasks:
            self._fail_first(w, results, pending, Result("error", error=f"the worker process died (exit code {code})"))
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
            raise RuntimeError(f"{self.name} worker processes fail to start: {self._last_start_error.strip()}")
        self._replace(w)


__all__ = ["Result", "WorkerPool", "cores_per_process", "forkserver_preload"]
