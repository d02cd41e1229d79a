"""The sampling values vLLM 0.30 refuses, checked in one place for both stand-ins (the server and ``vllm.LLM``).

``check_sampling(params)`` takes anything with the engine's sampling fields (a ``SamplingSpec`` built from an HTTP
request, the fake package's ``SamplingParams``) and raises ``SamplingError`` with vLLM's message for the first value
vLLM's ``SamplingParams`` refuses: the server answers it as a 400, ``SamplingParams`` raises it as
``VLLMValidationError``.

    check_sampling(SamplingSpec(n=2, temperature=0.0))  # SamplingError: n must be 1 when using greedy sampling, got 2.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

from .engine import SAMPLING_EPS


TAGGED_FIELDS = ("temperature", "top_p", "max_tokens", "logprobs")  # those vLLM's VLLMValidationError names


class SamplingError(ValueError):
    """A sampling value vLLM refuses. ``field`` names it; ``tagged``: vLLM's ``VLLMValidationError`` carries the field
    and the value too (``parameter=``, ``value=``)."""

    def __init__(self, message: str, field: str, value: Any, tagged: bool = False):
        super().__init__(message)
        self.message, self.field, self.value, self.tagged = message, field, value, tagged


def _checks(p) -> Iterator[tuple[bool, str, str]]:
    """(ok, field, vLLM's message) for each value vLLM checks, in vLLM's order; each evaluated when reached."""
    max_n = int(os.environ.get("VLLM_MAX_N_SEQUENCES", "16384"))
    yield isinstance(p.n, int), "n", f"n must be an int, but is of type {type(p.n)}"
    yield p.n >= 1, "n", f"n must be at least 1, got {p.n}."
    hint = "To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable."
    yield p.n <= max_n, "n", f"n must be at most {max_n}, got {p.n}. {hint}"
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        yield -2.0 <= value <= 2.0, name, f"{name} must be in [-2, 2], got {value}."
    penalty = p.repetition_penalty
    yield math.isfinite(penalty), "repetition_penalty", f"repetition_penalty must be a finite number, got {penalty}."
    yield penalty > 0.0, "repetition_penalty", f"repetition_penalty must be greater than zero, got {penalty}."
    t = p.temperature
    yield math.isfinite(t), "temperature", f"temperature must be a finite number, got {t}."
    yield t >= 0.0, "temperature", f"temperature must be non-negative, got {t}."
    yield t <= 2.0, "temperature", f"temperature must be in [0, 2], got {t}."
    yield 0.0 < p.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {p.top_p}."
    yield isinstance(p.top_k, int), "top_k", f"top_k must be an integer, got {type(p.top_k).__name__}"
    yield p.top_k >= -1, "top_k", f"top_k must be 0 (disable), or at least 1, got {p.top_k}."
    yield 0.0 <= p.min_p <= 1.0, "min_p", f"min_p must be in [0, 1], got {p.min_p}."
    most, least = p.max_tokens, p.min_tokens
    yield most is None or most >= 1, "max_tokens", f"max_tokens must be at least 1, got {most}."
    yield least >= 0, "min_tokens", f"min_tokens must be greater than or equal to 0, got {least}."
    ok = most is None or least <= most
    yield ok, "min_tokens", f"min_tokens must be less than or equal to max_tokens={most}, got {least}."
    k = p.logprobs
    yield k is None or k == -1 or k >= 0, "logprobs", f"logprobs must be non-negative or -1, got {k}."
    stops = p.stop_token_ids
    ok = all(isinstance(token, int) and not isinstance(token, bool) for token in stops)
    yield ok, "stop_token_ids", f"stop_token_ids must contain only integers, got {stops}."
    yield t >= SAMPLING_EPS or p.n == 1, "n", f"n must be 1 when using greedy sampling, got {p.n}."


def check_sampling(params) -> None:
    """Raise ``SamplingError`` for the first value vLLM's ``SamplingParams`` refuses (see the module docstring)."""
    for ok, field, message in _checks(params):
        if not ok:
            raise SamplingError(message, field, getattr(params, field), field in TAGGED_FIELDS)
