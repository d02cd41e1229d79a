"""Rewards run the way TRL calls them, each completion in a worker process with a hard timeout (``reward_isolation``).

``RewardPool`` is a ``hf_grpo.base.workers.WorkerPool`` with the graders loaded and warm. ``isolate(fn, pool, timeout)``
wraps a reward as an ``IsolatedReward`` (``IsolatedCorrectness`` for ``GRADED_REWARDS``): a completion that times
out or raises gets no reward (``None``, which TRL skips) and is counted per reward; ``load_reward_funcs`` does this
for every reward of a recipe. What is sent, which rewards can be isolated, an example: docs/reward_workers.md.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import logging
import math
import numbers
import pickle
import sys
import time
import types
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..base.workers import Result, WorkerPool
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
    "hf_grpo.base.workers",
    "hf_grpo.rewards",
    "hf_grpo.rewards.functions",
    "hf_grpo.rewards.grading",
    "hf_grpo.rewards.wrapper",
    "sympy",
    "latex2sympy2_extended",
    "math_verify",
)


class RewardIsolationError(ValueError):
    """A reward function cannot be run in a worker process (it cannot be sent to or loaded by one)."""


class RewardFailedError(RuntimeError):
    """A reward failed (raised or timed out) on every completion of several consecutive calls: a broken reward, not a
    hard completion. The message names the reward, its error and a sample input."""


def warm_up() -> None:
    """The reward workers' initializer: one MATH grade, so a worker's first real grade is as fast as the next."""
    grade("so $\\boxed{\\frac{1}{2}}$", "\\boxed{0.5}", "math")


class RewardPool(WorkerPool):
    """A ``WorkerPool`` for rewards and grading: its fork server imports the graders (``PRELOAD``: SymPy,
    math-verify, this package's rewards) and each worker runs ``warm_up`` before it is ready. Takes the arguments of
    ``WorkerPool`` (``preload``: the modules of user reward functions).

    ``counters`` holds cumulative ``{"timeouts": n, "errors": n}`` per reward name (filled by ``IsolatedReward``).
    """

    def __init__(self, num_workers: int | None = None, *, initializer: Callable[[], None] | None = warm_up, **kwargs):
        self.counters: dict[str, dict[str, int]] = {}
        super().__init__(num_workers, server_preload=PRELOAD, initializer=initializer, name="reward", **kwargs)


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
    return reward_values(out, 1)[0], dict(metrics), dict(extras)


RETURNS = "a reward function must return a list (or a 1-D numpy array or tensor) with one reward per completion"


def reward_values(out: Any, n: int) -> list[float | None]:
    """What a reward function returned for ``n`` completions as floats and None, accepting what TRL accepts (it makes
    ``torch.tensor(out, dtype=torch.float32)``, None as NaN): a list or tuple, a 1-D numpy array or tensor, of
    numbers (bools, numpy scalars, 0-d tensors) or None. Anything else is a ``TypeError`` naming its type (not its
    values, so the same mistake is one message: logged once)."""
    ndim = getattr(out, "ndim", None)
    if isinstance(ndim, int) and hasattr(out, "tolist"):  # a numpy array or a torch tensor
        if ndim != 1:
            raise TypeError(f"{RETURNS}, got a {ndim}-D {type(out).__name__}")
        out = out.tolist()
    elif not isinstance(out, (list, tuple)):
        raise TypeError(f"{RETURNS}, got a {type(out).__name__}")
    if len(out) != n:
        raise TypeError(f"{RETURNS}, got {len(out)} rewards for {n} completion{'s' if n != 1 else ''}")
    return [_reward_value(value) for value in out]


def _reward_value(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, numbers.Real):  # bool, int, float, numpy's float and int scalars
        return float(value)
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # np.bool_, a 0-d array or tensor
        item = value.item()
        if isinstance(item, numbers.Real):
            return float(item)
    raise TypeError(f"a reward must be a number (or a bool) or None, got a {type(value).__name__}")


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
    ``trainer_state`` (``state_snapshot``: its attributes without ``log_history``), and ``log_metric`` / ``log_extra``
    proxies. What the reward logs comes back with its result and reaches the trainer: per call, each metric's values
    averaged over the completions (one ``log_metric`` call, as a batch-level reward makes), each extra column with one
    value per completion (None for a completion that failed). ``environments`` stays in the training process.

    A timeout or an exception gives ``None``. Per call, ``rewards/<name>/timeouts`` and ``rewards/<name>/errors`` go
    to TRL's ``log_metric``; cumulative counts are in ``pool.counters[name]``. The first error is logged as a warning
    naming the reward, the first timeout too. When every completion of ``max_failed_calls`` consecutive calls
    fails, the reward is broken (a wrong signature, a missing column), and the call raises ``RewardFailedError``.
    A reward that fails now and then warns once; every traceback goes to ``error_log`` and ``summary`` counts them.

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
        self.__name__ = self.__qualname__ = name
        self.__doc__ = getattr(_unwrap(fn), "__doc__", None)
        self._warned_timeout = False
        self._failed_calls = 0
        self.errors, self.first_error = 0, None  # the completions it failed on, and its first error
        self.error_log: Path | None = None  # where every failure's traceback goes (the trainer sets its run's)
        self.last_nan = 0  # NaN rewards the function returned in the last call
        pool.counters.setdefault(name, {"timeouts": 0, "errors": 0})

    def __repr__(self) -> str:
        return f"IsolatedReward({self.__name__!r}, timeout={self.timeout:g}, {self.pool!r})"

    def __call__(self, prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float | None]:
        columns = {k: v for k, v in kwargs.items() if k not in NOT_SENT}
        n = len(completions)
        per_item = {k: v for k, v in columns.items() if isinstance(v, (list, tuple)) and len(v) == n}
        shared = {k: v for k, v in columns.items() if k not in per_item}  # passed whole to every call
        per_item |= {k: v for k, v in (("prompts", prompts), ("completion_ids", completion_ids)) if v is not None}
        items = [
            {"completions": [c], **shared, **{k: [v[i]] for k, v in per_item.items()}}
            for i, c in enumerate(completions)
        ]
        state = kwargs.get("trainer_state")
        context = {} if state is None else {"trainer_state": state_snapshot(state)}
        results = self.pool.map(functools.partial(_score_one, self.fn, context), items, self.timeout)
        self._account(results, completions, kwargs.get("log_metric"), sample=items[0] if items else None)
        self._replay([r.value if r.ok else None for r in results], kwargs.get("log_metric"), kwargs.get("log_extra"))
        rewards = [r.value[0] if r.ok else None for r in results]
        # NaN rewards: the trainer counts them in rewards/<name>/nonfinite (after TRL, NaN is None)
        self.last_nan = sum(value is not None and math.isnan(value) for value in rewards)
        return [None if value is not None and math.isnan(value) else value for value in rewards]

    @staticmethod
    def _replay(outputs: list, log_metric, log_extra) -> None:
        """Pass what the reward logged in the workers to the trainer's ``log_metric`` / ``log_extra``."""
        done = [out for out in outputs if out is not None]
        if log_metric is not None:
            for name in dict.fromkeys(name for _, metrics, _ in done for name in metrics):
                values = [v for _, metrics, _ in done for v in metrics.get(name, ())]
                log_metric(name, sum(values) / len(values))
        if log_extra is not None:
            for column in dict.fromkeys(column for _, _, extras in done for column in extras):
                values = [v for out in outputs for v in (out[2].get(column, [None]) if out is not None else [None])]
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
        """The first failure: one warning line (no traceback); every failure: its traceback in ``error_log`` when the
        trainer set one (``OUTPUT_DIR/logs/reward_errors.log``), so a reward that fails now and then while training
        goes on fills the log file, not the console. ``summary`` says at the end how many failed."""
        self.errors += 1
        self.first_error = self.first_error or result.error
        if self.error_log is not None:
            self.error_log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.error_log, "a", encoding="utf-8") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} reward {self.__name__!r} on completion "
                        f"{_snippet(completion)}: {result.error}\n{(result.traceback or '').rstrip()}\n\n")  # fmt: skip
        if self.errors > 1:
            return
        where = f"every traceback goes to {self.error_log}" if self.error_log else "more are only counted"
        logger.warning(
            "reward %r failed on completion %s: %s; it gets no reward, and training goes on (failures are counted "
            "in rewards/%s/errors; %s)", self.__name__, _snippet(completion), result.error, self.__name__, where,
        )  # fmt: skip

    def summary(self) -> str | None:
        """One line on the failures of the run so far, or None without any."""
        if not self.errors:
            return None
        where = f"; every traceback: {self.error_log}" if self.error_log else ""
        return f"reward {self.__name__!r} failed on {self.errors} completion(s) (first: {self.first_error}){where}"


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
        log_grades([r.value for r in checked if r.ok], log_metric)
        return [(1.0 if r.value == "correct" else 0.0) if r.ok else None for r in checked]


class CheckedReward:
    """A reward called in the training process (``reward_isolation: false``), its return read as TRL reads it
    (``reward_values``: a list or a 1-D array or tensor comes back a list of floats and None).

    A return TRL cannot use (a string, a dict, a 2-D array, the wrong length) gives no reward for the call (None per
    completion) instead of a crash or a silent misreading (TRL iterates a dict's keys), is logged once naming its
    type and counted in ``rewards/<name>/errors``; ``max_failed_calls`` such calls in a row raise
    ``RewardFailedError``, as an isolated reward does."""

    def __init__(self, fn: Callable, name: str, max_failed_calls: int = DEFAULT_MAX_FAILED_CALLS):
        self.fn = fn
        self.max_failed_calls = max_failed_calls
        self.__name__ = self.__qualname__ = name
        self.__doc__ = getattr(_unwrap(fn), "__doc__", None)
        self._reported: set[str] = set()
        self._failed_calls = 0

    def __repr__(self) -> str:
        return f"CheckedReward({self.__name__!r})"

    def __call__(self, *args, **kwargs) -> list[float | None]:
        n = len(kwargs["completions"] if "completions" in kwargs else args[0])
        out = self.fn(*args, **kwargs)  # the reward's own exceptions propagate, as under TRL
        try:
            rewards, error = reward_values(out, n), None
        except TypeError as exc:
            rewards, error = [None] * n, f"TypeError: {exc}"
        if kwargs.get("log_metric") is not None:
            kwargs["log_metric"](f"rewards/{self.__name__}/errors", float(n if error else 0))
        self._failed_calls = self._failed_calls + 1 if error else 0
        if error and self._failed_calls >= self.max_failed_calls:
            raise RewardFailedError(
                f"reward {self.__name__!r} returned what TRL cannot use in {self._failed_calls} consecutive calls "
                f"({self.max_failed_calls} allowed: reward_max_failed_calls): {error}"
            )
        if error and error not in self._reported:
            self._reported.add(error)
            logger.warning(
                "reward %r failed: %s; its %d completions get no reward (counted in rewards/%s/errors)",
                self.__name__,
                error,
                n,
                self.__name__,
            )
        return rewards


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
    return list(dict.fromkeys(module for fn in fns if (module := getattr(_unwrap(fn), "__module__", None))))


__all__ = [
    "NOT_SENT",
    "CheckedReward",
    "IsolatedCorrectness",
    "IsolatedReward",
    "Result",
    "RewardFailedError",
    "RewardIsolationError",
    "RewardPool",
    "is_async",
    "isolate",
    "reward_modules",
    "reward_values",
]
