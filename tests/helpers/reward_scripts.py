"""Scripted rewards for trainer tests: rewards that do not depend on what the model generates.

``half_varying``: groups whose question mentions an odd first operand get rewards 0, 1, 0, 1, ... (kept by dynamic
sampling); the others get all zeros (dropped). Rows arrive group-major, so the position in the list says which
completion of its group a row is.
"""

from __future__ import annotations

import re


def _first_number(prompt) -> int:
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    return int(re.search(r"\d+", text).group(0))


def half_varying(prompts, completions, **kwargs) -> list[float]:
    return [float(i % 2) if _first_number(p) % 2 else 0.0 for i, p in enumerate(prompts)]


def third_varying(prompts, completions, **kwargs) -> list[float]:
    """0/1 alternating for a prompt whose first number is a multiple of 3, else 0 for every sample: about two thirds
    of the groups carry no signal, whatever the model writes (as in the default run, which keeps about a third)."""
    return [float(i % 2) if _first_number(p) % 3 == 0 else 0.0 for i, p in enumerate(prompts)]


def always_zero(prompts, completions, **kwargs) -> list[float]:
    return [0.0] * len(prompts)


def always_one(prompts, completions, **kwargs) -> list[float]:
    return [1.0] * len(prompts)


def alternating(prompts, completions, **kwargs) -> list[float]:
    """0, 1, 0, 1, ... in every group: every group has a learning signal, whatever the model writes."""
    return [float(i % 2) for i in range(len(prompts))]
