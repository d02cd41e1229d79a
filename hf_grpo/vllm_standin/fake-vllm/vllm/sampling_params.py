"""vLLM 0.30's ``SamplingParams`` and ``StructuredOutputsParams`` for the stand-in ``LLM``.

``SamplingParams`` has vLLM's fields and defaults, normalises as vLLM does (``seed=-1`` -> None, ``stop`` as a list,
``logprobs=True`` -> 1, 0 < temperature < 0.01 raised to 0.01, greedy resets top_p/top_k/min_p) and refuses what
vLLM refuses, with ``VLLMValidationError`` and vLLM's messages: the checks the server shares
(``hf_grpo.vllm_standin.validation``), negative prompt logprobs, empty stop strings or bad words. ``to_engine_spec``
gives the engine's request and refuses (``NotImplementedError``) stop strings, structured outputs, logit bias,
allowed token ids, bad words, prompt logprobs and logprob token ids, which the stand-in does not implement.
"""

import logging
from dataclasses import dataclass, field, fields, replace
from enum import Enum, IntEnum
from typing import Any

from hf_grpo.vllm_standin.engine import SAMPLING_EPS as _SAMPLING_EPS
from hf_grpo.vllm_standin.engine import SamplingSpec
from hf_grpo.vllm_standin.validation import SamplingError, check_sampling
from vllm.exceptions import VLLMValidationError


logger = logging.getLogger(__name__)

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
        if self.temperature < _SAMPLING_EPS:  # greedy (n > 1 was refused above)
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        self._all_stop_token_ids = set(self.stop_token_ids)

    def _verify_args(self) -> None:
        """vLLM's checks: those the server shares (``hf_grpo.vllm_standin.validation``), then the request-only ones."""
        try:
            check_sampling(self)
        except SamplingError as exc:
            named = {"parameter": exc.field, "value": exc.value} if exc.tagged else {}
            raise VLLMValidationError(exc.message, **named) from None
        if self.prompt_logprobs is not None and self.prompt_logprobs != -1 and self.prompt_logprobs < 0:
            raise VLLMValidationError(
                f"prompt_logprobs must be non-negative or -1, got {self.prompt_logprobs}.",
                parameter="prompt_logprobs",
                value=self.prompt_logprobs,
            )
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
        """The request for ``hf_grpo.vllm_standin.engine``; refuses the features the stand-in does not implement."""
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
