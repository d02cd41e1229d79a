"""Rewards: grading, the built-in reward functions, and how a recipe names them.

``resolve_reward`` reads a name of ``reward_funcs`` (``module.path:function``, a built-in of ``REWARD_FUNCS``, a
TRL reward name as ``trl grpo --reward_funcs`` takes it, or a dotted path); ``reward_name`` names its metrics and
``reward_kwargs`` entry. ``load_reward_funcs`` returns the callables for TRL, in worker processes with a hard
timeout when ``reward_isolation`` is on (``hf_grpo.rewards.wrapper``). ``grade`` is the single grading function
every part of the project uses. Spellings, their order and TRL's factories: docs/grading.md.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .functions import REWARD_FUNCS, TRL_FACTORY_REWARDS, completion_text
from .grading import GRADES, grade
from .wrapper import CheckedReward, RewardIsolationError, RewardPool, is_async, isolate, reward_modules


logger = logging.getLogger(__name__)


@dataclass
class RewardArguments:
    """
    Reward options.

    Args:
        reward_funcs (`list[str]`, defaults to `["gsm8k_correctness"]`):
            Built-in reward names (`REWARD_FUNCS`), TRL's reward names as `trl grpo` accepts them (`accuracy_reward`,
            `think_format_reward`, `get_soft_overlong_punishment`, ...; a built-in name wins over a TRL one spelled the
            same), or your own as `module.path:function` or `module.path.function` (`trl.rewards.accuracy_reward` works
            too). A reward is called like TRL calls reward functions: `fn(prompts=..., completions=...,
            completion_ids=..., **dataset_columns)`, returning one number (or bool) or None per completion, as a list
            or a 1-D numpy array or tensor (what TRL accepts); another return (a string, a dict, a 2-D array, the wrong
            length) gives no reward for the call, is counted in `rewards/<name>/errors` and named in one warning.
        reward_kwargs (`dict`, *optional*):
            Keyword arguments per reward name, e.g. `{soft_overlong: {max_completion_len: 512, cache: 128}}`.
        reward_isolation (`bool`, defaults to `True`):
            Run every reward in a pool of warm worker processes with a hard per-completion timeout: a completion that
            hangs or makes a reward raise gets no reward (None, which TRL skips) and is counted in
            `rewards/<name>/timeouts` or `rewards/<name>/errors` (an error is also logged once, with the reward's
            name). Your own functions must then be defined at module level in an importable module (or be a
            `functools.partial` of one); a lambda or nested function is refused when the run starts. `async`
            rewards stay in the training process, as TRL runs them. `False` calls every reward in the training
            process, as TRL does.
        reward_timeout (`float`, defaults to `10.0`):
            Seconds one completion may take to score before its worker is killed and replaced and the completion gets
            no reward. Only with `reward_isolation`.
        reward_max_failed_calls (`int`, defaults to `3`):
            Stop the run when an isolated reward fails (raises or times out) on every completion of this many
            consecutive calls: a broken reward (a wrong signature, a missing column) must not cost a night of training
            on no rewards. The error names the reward, its exception and a sample input.
        reward_workers (`int`, *optional*):
            Reward worker processes per training process. Defaults to the CPU cores available, divided among the
            training processes on the machine (at least 1). Only with `reward_isolation`.
    """

    reward_funcs: list[str] = field(
        default_factory=lambda: ["gsm8k_correctness"],
        metadata={
            "help": "Built-in reward names, TRL's reward names (`accuracy_reward`, `think_format_reward`, ...; a "
            "built-in wins over a TRL name spelled the same), or `module.path:function` / `module.path.function`."
        },
    )
    reward_kwargs: dict[str, Any] | None = field(default=None, metadata={"help": "Keyword arguments per reward name."})
    reward_isolation: bool = field(
        default=True,
        metadata={
            "help": "Run rewards in warm worker processes with a hard per-completion timeout (a hang or an error "
            "gives no reward and is counted); false calls them in-process, as TRL does."
        },
    )
    reward_timeout: float = field(
        default=10.0,
        metadata={"help": "Seconds per completion before its reward worker is killed and it gets no reward."},
    )
    reward_max_failed_calls: int = field(
        default=3,
        metadata={"help": "Stop when an isolated reward fails on every completion of this many consecutive calls."},
    )
    reward_workers: int | None = field(
        default=None,
        metadata={"help": "Reward worker processes (default: the CPU cores, divided among local training processes)."},
    )

    def __post_init__(self):
        if not self.reward_timeout > 0:
            raise ValueError(f"reward_timeout must be positive, got {self.reward_timeout}")
        if self.reward_max_failed_calls < 1:
            raise ValueError(f"reward_max_failed_calls must be at least 1, got {self.reward_max_failed_calls}")
        if self.reward_workers is not None and self.reward_workers < 1:
            raise ValueError(f"reward_workers must be at least 1, got {self.reward_workers}")


class RewardLoadError(ValueError):
    """A reward named in a recipe cannot be found or imported."""


TRL_REWARDS_MODULE = "trl.rewards"


@functools.cache
def trl_reward_names() -> tuple[str, ...]:
    """The reward names TRL exports in the installed version (``trl.rewards``): its reward functions, and those of
    its factories that ``TRL_FACTORY_REWARDS`` stands in for."""
    module = importlib.import_module(TRL_REWARDS_MODULE)
    return tuple(
        name
        for name in module.__all__
        if inspect.isfunction(getattr(module, name)) and (name in TRL_FACTORY_REWARDS or not name.startswith("get_"))
    )


# open-r1's reward registry names (src/open_r1/rewards.py) and what takes their place here. Not aliases: the
# replacements grade differently in details (what counts as unparseable, the exact tags), so the user chooses.
OPEN_R1_REWARDS = {
    "accuracy": "use accuracy_reward (TRL's math-verify reward on the solution column) or math_correctness (the same "
    "grading, with unparseable answers counted apart from wrong ones)",
    "format": "use r1_zero_format (1.0 for <think>...</think> <answer>...</answer>)",
    "tag_count": "think_format (exactly one leading <think>...</think> block) is the closest; or your own as "
    "module.path:function",
    "cosine": "use get_cosine_scaled_reward (TRL's)",
    "repetition_penalty": "use get_repetition_penalty_reward (TRL's)",
    "soft_overlong_punishment": "use soft_overlong, or TRL's get_soft_overlong_punishment",
    "reasoning_steps": "no built-in equivalent: add yours as module.path:function",
}


def resolve_reward(name: str) -> Callable:
    """The function a recipe's reward name refers to; ``RewardLoadError`` (with a did-you-mean) when there is none.

    Spellings, in this order: ``module.path:function``; a built-in name (``REWARD_FUNCS``); a TRL reward name
    (``trl_reward_names()``); a dotted path ``module.path.function``. A TRL factory resolves to its stand-in in
    ``TRL_FACTORY_REWARDS``. Every result is a module-level function, so it pickles by reference for the workers.

    >>> resolve_reward("trl.rewards.think_format_reward") is resolve_reward("think_format_reward")
    True
    """
    if ":" in name:
        module_name, _, attr = name.partition(":")
        return _import_reward(name, module_name, attr)
    if name in REWARD_FUNCS:  # ours first: a built-in name wins over a TRL one spelled the same
        return REWARD_FUNCS[name]
    if name in trl_reward_names():
        return _trl_reward(getattr(importlib.import_module(TRL_REWARDS_MODULE), name))
    if "." in name:
        module_name, _, attr = name.rpartition(".")
        return _import_reward(name, module_name, attr)
    if name in OPEN_R1_REWARDS:
        raise RewardLoadError(f"reward_funcs: {name!r} is open-r1's name: {OPEN_R1_REWARDS[name]}")
    close = _close_matches(name, [*REWARD_FUNCS, *trl_reward_names()])
    raise RewardLoadError(
        f"reward_funcs: unknown reward {name!r}{f' (did you mean {close}?)' if close else ''}. Use a built-in reward "
        f"{sorted(REWARD_FUNCS)}, one of TRL's {sorted(trl_reward_names())}, or your own function as "
        "'module.path:function' or 'module.path.function'"
    )


def reward_name(name: str) -> str:
    """The name a reward's metrics are logged under: the function name of any spelling.

    >>> [reward_name(n) for n in ("accuracy_reward", "trl.rewards.accuracy_reward", "trl.rewards:accuracy_reward")]
    ['accuracy_reward', 'accuracy_reward', 'accuracy_reward']
    """
    return name.rpartition(":")[2].rpartition(".")[2]


def _import_reward(name: str, module_name: str, attr: str) -> Callable:
    """``attr`` of ``module_name``, imported (from the working directory too); TRL's factories are replaced."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # let recipes name modules that sit next to them
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is reported with its name
        raise RewardLoadError(f"reward_funcs: cannot import module {module_name!r} for {name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        functions = inspect.getmembers(module, lambda v: callable(v) and not inspect.isclass(v))
        callables = [key for key, _ in functions if not key.startswith("_")]
        close = _close_matches(attr, callables)
        raise RewardLoadError(
            f"reward_funcs: module {module_name!r} has no callable {attr!r} (from {name!r})"
            f"{f'; did you mean {close}?' if close else ''}"
        )
    return _trl_reward(fn)


def _trl_reward(fn: Callable) -> Callable:
    """``fn``, or the stand-in reward for it when it is one of TRL's reward factories."""
    if not (getattr(fn, "__module__", None) or "").startswith(TRL_REWARDS_MODULE + "."):
        return fn
    name = getattr(fn, "__name__", "")
    if name in TRL_FACTORY_REWARDS:
        return TRL_FACTORY_REWARDS[name]
    if name.startswith("get_"):
        raise RewardLoadError(
            f"reward_funcs: TRL's {name!r} builds a reward rather than being one; call it in a module-level function "
            "of your own module and name that"
        )
    return fn


def _close_matches(name: str, candidates: list[str]) -> str:
    """The (up to 3) candidates closest to ``name``, ignoring case, best first, as ``"'x' or 'y'"``; ``""`` if none.

    difflib's closest matches come first, then candidates that start with or contain ``name`` (``gsm8k`` is too
    short for difflib to match ``gsm8k_correctness``).
    """
    by_lower = {candidate.lower(): candidate for candidate in candidates}
    key = name.lower()
    close = difflib.get_close_matches(key, list(by_lower), n=3, cutoff=0.6)
    close += sorted(
        (c for c in by_lower if key in c and c not in close), key=lambda c: (not c.startswith(key), len(c))
    )
    return " or ".join(repr(by_lower[c]) for c in close[:3])


def load_reward_funcs(args: RewardArguments) -> list[Callable]:
    """Callables for TRL, in recipe order, with ``reward_kwargs`` bound and ``__name__`` set for its metrics.

    With ``args.reward_isolation`` they are ``IsolatedReward`` objects sharing one ``RewardPool`` (``fn.pool``, whose
    ``counters`` hold the timeouts and errors per reward); a reward the workers cannot load is a ``RewardLoadError``
    naming it, raised here rather than in the middle of training.
    """
    kwargs = args.reward_kwargs or {}
    if unknown := set(kwargs) - set(args.reward_funcs):
        raise RewardLoadError(f"reward_kwargs: {sorted(unknown)} are not in reward_funcs {args.reward_funcs}")
    resolved = [(name, resolve_reward(name)) for name in args.reward_funcs]
    to_isolate = [fn for _, fn in resolved if args.reward_isolation and not is_async(fn)]
    pool = RewardPool(args.reward_workers, preload=reward_modules(to_isolate)) if to_isolate else None
    max_failed, funcs = args.reward_max_failed_calls, []
    try:
        for name, fn in resolved:
            bound = functools.partial(fn, **kwargs[name]) if name in kwargs else fn
            if args.reward_isolation and is_async(fn):
                logger.info("reward %r is async: it runs in the training process, as TRL runs it (not isolated)", name)
            if pool is None or is_async(fn):
                funcs.append(_in_process(name, fn, bound, max_failed))
                continue
            try:
                funcs.append(isolate(bound, pool, reward_name(name), args.reward_timeout, max_failed))
            except RewardIsolationError as exc:
                raise RewardLoadError(f"reward_funcs: {exc}") from exc
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    return funcs


def _in_process(name: str, fn: Callable, bound: Callable, max_failed_calls: int) -> Callable:
    """A reward called in the training process, as TRL calls it, with ``__name__`` set for its metrics. A user's
    (not async, not built in) is a ``CheckedReward``: what it returns is checked as an isolated reward's is."""
    if not is_async(fn) and fn not in REWARD_FUNCS.values():
        return CheckedReward(bound, reward_name(name), max_failed_calls)
    if bound is not fn:
        bound = functools.update_wrapper(bound, fn)
    bound.__name__ = reward_name(name)
    return bound


__all__ = [
    "GRADES",
    "REWARD_FUNCS",
    "TRL_FACTORY_REWARDS",
    "RewardArguments",
    "RewardLoadError",
    "completion_text",
    "grade",
    "load_reward_funcs",
    "resolve_reward",
    "reward_name",
    "trl_reward_names",
]
