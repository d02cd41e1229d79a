"""Rewards: grading, the built-in reward functions, and how a recipe names them.

``reward_funcs`` in a recipe lists built-in names (see ``REWARD_FUNCS``) or ``module.path:function`` for a user's
own function; ``reward_kwargs`` passes keyword arguments to one of them by name, and TRL's ``reward_weights``
scales them. ``grade`` is the single grading function every part of the project uses.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .functions import REWARD_FUNCS, completion_text
from .grading import GRADES, grade


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
    """

    reward_funcs: list[str] = field(
        default_factory=lambda: ["gsm8k_correctness"],
        metadata={"help": "Built-in reward names or `module.path:function`."},
    )
    reward_kwargs: dict[str, Any] | None = field(default=None, metadata={"help": "Keyword arguments per reward name."})


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
    """Callables for TRL, in recipe order, with ``reward_kwargs`` bound and ``__name__`` set for its metrics."""
    kwargs = args.reward_kwargs or {}
    unknown = set(kwargs) - set(args.reward_funcs)
    if unknown:
        raise RewardLoadError(f"reward_kwargs: {sorted(unknown)} are not in reward_funcs {args.reward_funcs}")
    funcs = []
    for name in args.reward_funcs:
        fn = resolve_reward(name)
        if name in kwargs:
            fn = functools.update_wrapper(functools.partial(fn, **kwargs[name]), fn)
        fn.__name__ = reward_name(name)
        funcs.append(fn)
    return funcs


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
