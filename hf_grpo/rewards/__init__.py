"""Rewards: grading, the built-in reward functions, and how a recipe names them.

``reward_funcs`` in a recipe lists built-in names (see ``REWARD_FUNCS``) or ``module.path:function`` for a user's
own function; ``reward_kwargs`` passes keyword arguments to one of them by name, and TRL's ``reward_weights``
scales them. ``grade`` is the single grading function every part of the project uses.

``load_reward_funcs`` returns the callables for TRL. With ``reward_isolation`` (the default) they run in a pool of
``reward_workers`` warm worker processes with a hard ``reward_timeout`` per completion (``hf_grpo.rewards.isolation``):
a completion that hangs or makes a reward raise gets no reward (None) instead of stalling or crashing training, and
is counted in ``rewards/<name>/timeouts`` / ``rewards/<name>/errors``.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .functions import REWARD_FUNCS, completion_text
from .grading import GRADES, grade


logger = logging.getLogger(__name__)


@dataclass
class RewardArguments:
    """
    Reward options.

    Args:
        reward_funcs (`list[str]`, defaults to `["gsm8k_correctness"]`):
            Built-in reward names or `module.path:function` for your own (called like TRL calls reward functions:
            `fn(prompts=..., completions=..., completion_ids=..., **dataset_columns)`, returning one float or None
            per completion).
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
        reward_workers (`int`, *optional*):
            Reward worker processes per training process. Defaults to the CPU cores available, divided among the
            training processes on the machine (at least 1). Only with `reward_isolation`.
    """

    reward_funcs: list[str] = field(
        default_factory=lambda: ["gsm8k_correctness"],
        metadata={"help": "Built-in reward names or `module.path:function`."},
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
    reward_workers: int | None = field(
        default=None,
        metadata={"help": "Reward worker processes (default: the CPU cores, divided among local training processes)."},
    )

    def __post_init__(self):
        if not self.reward_timeout > 0:
            raise ValueError(f"reward_timeout must be positive, got {self.reward_timeout}")
        if self.reward_workers is not None and self.reward_workers < 1:
            raise ValueError(f"reward_workers must be at least 1, got {self.reward_workers}")


class RewardLoadError(ValueError):
    """A reward named in a recipe cannot be found or imported."""


def resolve_reward(name: str) -> Callable:
    """The function a recipe's reward name refers to (built-in name or ``module.path:function``)."""
    if name in REWARD_FUNCS:
        return REWARD_FUNCS[name]
    if ":" not in name:
        raise RewardLoadError(
            f"reward_funcs: unknown reward {name!r}; use one of {sorted(REWARD_FUNCS)} or 'module.path:function'"
        )
    module_name, _, attr = name.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # let recipes name modules that sit next to them
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is reported with its name
        raise RewardLoadError(f"reward_funcs: cannot import module {module_name!r} for {name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardLoadError(f"reward_funcs: module {module_name!r} has no callable {attr!r} (from {name!r})")
    return fn


def reward_name(name: str) -> str:
    """The name a reward's metrics are logged under (the function name for ``module:function``)."""
    return name.rpartition(":")[2]


def load_reward_funcs(args: RewardArguments) -> list[Callable]:
    """Callables for TRL, in recipe order, with ``reward_kwargs`` bound and ``__name__`` set for its metrics.

    With ``args.reward_isolation`` they are ``IsolatedReward`` objects sharing one ``RewardPool`` (``fn.pool``, whose
    ``counters`` hold the timeouts and errors per reward); a reward the workers cannot load is a ``RewardLoadError``
    naming it, raised here rather than in the middle of training.
    """
    kwargs = args.reward_kwargs or {}
    unknown = set(kwargs) - set(args.reward_funcs)
    if unknown:
        raise RewardLoadError(f"reward_kwargs: {sorted(unknown)} are not in reward_funcs {args.reward_funcs}")
    resolved = []
    for name in args.reward_funcs:
        fn = resolve_reward(name)
        resolved.append((name, fn, functools.partial(fn, **kwargs[name]) if name in kwargs else fn))
    if not args.reward_isolation:
        return [_in_process(name, fn, bound) for name, fn, bound in resolved]

    from .isolation import RewardIsolationError, RewardPool, is_async, isolate, reward_modules

    to_isolate = [(name, fn, bound) for name, fn, bound in resolved if not is_async(fn)]
    pool = (
        RewardPool(args.reward_workers, preload=reward_modules([fn for _, fn, _ in to_isolate]))
        if to_isolate
        else None
    )
    funcs = []
    try:
        for name, fn, bound in resolved:
            if is_async(fn):
                logger.info("reward %r is async: it runs in the training process, as TRL runs it (not isolated)", name)
                funcs.append(_in_process(name, fn, bound))
                continue
            try:
                funcs.append(isolate(bound, pool, name=reward_name(name), timeout=args.reward_timeout))
            except RewardIsolationError as exc:
                raise RewardLoadError(f"reward_funcs: {exc}") from exc
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    return funcs


def _in_process(name: str, fn: Callable, bound: Callable) -> Callable:
    """A reward called in the training process, as TRL calls it, with ``__name__`` set for its metrics."""
    if bound is not fn:
        bound = functools.update_wrapper(bound, fn)
    bound.__name__ = reward_name(name)
    return bound


__all__ = [
    "GRADES",
    "REWARD_FUNCS",
    "RewardArguments",
    "RewardLoadError",
    "completion_text",
    "grade",
    "load_reward_funcs",
    "resolve_reward",
]
