"""vLLM 0.30's ``SamplingParams`` and ``StructuredOutputsParams`` (``vllm/sampling_params.py``) for the stand-in.

``SamplingParams`` has vLLM's fields and defaults, normalises as vLLM does (``seed=-1`` -> None, ``stop`` as a list,
``logprobs=True`` -> 1, 0 < temperature < 0.01 raised to 0.01, greedy resets top_p/top_k/min_p) and refuses the
values vLLM refuses (``VLLMValidationError`` with vLLM's messages): n < 1 or above ``VLLM_MAX_N_SEQUENCES``,
n > 1 with greedy sampling, temperature outside [0, 2], top_p outside (0, 1], top_k < -1, min_p outside [0, 1],
non-positive repetition penalty, presence/frequency penalty outside [-2, 2], max_tokens < 1, min_tokens outside
[0, max_tokens], logprobs < -1, non-integer stop token ids, empty stop strings. The stand-in's ``LLM`` samples with
n, temperature, top_p, top_k, min_p, the three penalties, seed, stop_token_ids, ignore_eos, max_tokens, min_tokens,
logprobs, detokenize and skip_special_tokens; a request that sets stop strings, structured outputs, logit bias,
allowed token ids, bad words, prompt logprobs or logprob token ids is refused with ``NotImplementedError`` when it is
generated (``to_engine_spec``).
"""

import logging
import math
import os
from dataclasses import dataclass, field, fields, replace
from enum import Enum, IntEnum
from typing import Any

from hf_grpo.miniature.engine import SamplingSpec
from vllm.exceptions import VLLMValidationError


logger = logging.getLogger(__name__)

_SAMPLING_EPS = 1e-5
_MAX_TEMP = 1e-2


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class StructuredOutputsParams:
    """Constraints for structured outputs; exactly one of the constraint fields must be set (vLLM's rule)."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    def __post_init__(self):
        constraints = (self.json, self.regex, self.choice, self.grammar, self.json_object, self.structural_tag)
        count = sum(c is not None for c in constraints)
        if count > 1:
            raise VLLMValidationError(
                "You can only use one kind of structured outputs constraint but multiple are specified: "
                f"{self.__dict__}"
            )
        if count < 1:
            raise VLLMValidationError(
                f"You must use one kind of structured outputs constraint but none are specified: {self.__dict__}"
            )


@dataclass
class SamplingParams:
    """Sampling parameters for one request, as in vLLM 0.30 (the fields below, with its defaults)."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    bad_words: list[str] | None = None
    _all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if 0 < self.temperature < _MAX_TEMP:
            logger.warning(
                "temperature %s is less than %s, which may cause numerical errors nan or inf in tensors. We have "
                "maxed it out to %s.",
                self.temperature,
                _MAX_TEMP,
                _MAX_TEMP,
            )
            self.temperature = _MAX_TEMP
        if self.seed == -1:
            self.seed = None
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop_token_ids = [] if self.stop_token_ids is None else list(dict.fromkeys(self.stop_token_ids))
        self.bad_words = [] if self.bad_words is None else list(dict.fromkeys(self.bad_words))
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {self.n}.")
        self._all_stop_token_ids = set(self.stop_token_ids)

    def _verify_args(self) -> None:
        if not isinstance(self.n, int):
            raise VLLMValidationError(f"n must be an int, but is of type {type(self.n)}")
        if self.n < 1:
            raise VLLMValidationError(f"n must be at least 1, got {self.n}.")
        max_n = int(os.environ.get("VLLM_MAX_N_SEQUENCES", "16384"))
        if self.n > max_n:
            raise VLLMValidationError(
                f"n must be at most {max_n}, got {self.n}. To increase this limit, set the VLLM_MAX_N_SEQUENCES "
                "environment variable."
            )
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise VLLMValidationError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise VLLMValidationError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not math.isfinite(self.repetition_penalty):
            raise VLLMValidationError(f"repetition_penalty must be a finite number, got {self.repetition_penalty}.")
        if self.repetition_penalty <= 0.0:
            raise VLLMValidationError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        if not math.isfinite(self.temperature):
            raise VLLMValidationError(
                f"temperature must be a finite number, got {self.temperature}.",
                parameter="temperature",
                value=self.temperature,
            )
        if self.temperature < 0.0:
            raise VLLMValidationError(
                f"temperature must be non-negative, got {self.temperature}.",
                parameter="temperature",
                value=self.temperature,
            )
        if self.temperature > 2.0:
            raise VLLMValidationError(
                f"temperature must be in [0, 2], got {self.temperature}.",
                parameter="temperature",
                value=self.temperature,
            )
        if not 0.0 < self.top_p <= 1.0:
            raise VLLMValidationError(
                f"top_p must be in (0, 1], got {self.top_p}.", parameter="top_p", value=self.top_p
            )
        if not isinstance(self.top_k, int):
            raise VLLMValidationError(f"top_k must be an integer, got {type(self.top_k).__name__}")
        if self.top_k < -1:
            raise VLLMValidationError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise VLLMValidationError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise VLLMValidationError(
                f"max_tokens must be at least 1, got {self.max_tokens}.",
                parameter="max_tokens",
                value=self.max_tokens,
            )
        if self.min_tokens < 0:
            raise VLLMValidationError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise VLLMValidationError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, got {self.min_tokens}."
            )
        if self.logprobs is not None and self.logprobs != -1 and self.logprobs < 0:
            raise VLLMValidationError(
                f"logprobs must be non-negative or -1, got {self.logprobs}.",
                parameter="logprobs",
                value=self.logprobs,
            )
        if self.prompt_logprobs is not None and self.prompt_logprobs != -1 and self.prompt_logprobs < 0:
            raise VLLMValidationError(
                f"prompt_logprobs must be non-negative or -1, got {self.prompt_logprobs}.",
                parameter="prompt_logprobs",
                value=self.prompt_logprobs,
            )
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            raise VLLMValidationError(f"stop_token_ids must contain only integers, got {self.stop_token_ids}.")
        if any(not s for s in self.stop):
            raise VLLMValidationError("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            raise VLLMValidationError(
                "stop strings are only supported when detokenize is True. Set detokenize=True to use stop."
            )
        if any(not w for w in self.bad_words):
            raise VLLMValidationError(f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}")

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def all_stop_token_ids(self) -> set[int]:
        return self._all_stop_token_ids

    def clone(self) -> "SamplingParams":
        return replace(self)

    @classmethod
    def from_optional(cls, **kwargs: Any) -> "SamplingParams":
        """vLLM's constructor that treats None as "use the default"."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in kwargs.items() if v is not None and k in names})

    def to_engine_spec(self) -> SamplingSpec:
        """The request for ``hf_grpo.miniature.engine``; refuses the features the stand-in does not implement."""
        unsupported = {
            "stop": bool(self.stop),
            "structured_outputs": self.structured_outputs is not None,
            "logit_bias": bool(self.logit_bias),
            "allowed_token_ids": self.allowed_token_ids is not None,
            "bad_words": bool(self.bad_words),
            "prompt_logprobs": self.prompt_logprobs is not None,
            "logprob_token_ids": bool(self.logprob_token_ids),
        }
        used = [name for name, on in unsupported.items() if on]
        if used:
            raise NotImplementedError(f"SamplingParams {used}: not implemented by hf_grpo's CPU stand-in for vLLM")
        return SamplingSpec(
            n=self.n,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
            stop_token_ids=frozenset(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logprobs=self.logprobs,
        )
