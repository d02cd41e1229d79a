"""vLLM 0.30's generation outputs (``vllm/outputs.py``): ``RequestOutput`` holding ``CompletionOutput``s."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vllm.logprobs import PromptLogprobs, SampleLogprobs


@dataclass
class CompletionOutput:
    """One completion of a request: ``token_ids`` (the stop token included), ``logprobs`` (one dict per token when
    requested, else None), ``cumulative_logprob`` (their sum when requested, else None), ``finish_reason`` ("stop" or
    "length") and ``stop_reason`` (the stop token id that ended it)."""

    index: int
    text: str
    token_ids: Sequence[int]
    cumulative_logprob: float | None
    logprobs: SampleLogprobs | None
    routed_experts: Any = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any = None
    sampling_mask: Any = None
    spec_decode_metrics: Any = None

    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput:
    """The output of one request (one prompt): its ``prompt_token_ids`` and its ``outputs`` (n completions)."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int] | None,
        prompt_logprobs: PromptLogprobs | None,
        outputs: list[CompletionOutput],
        finished: bool,
        metrics: Any = None,
        lora_request: Any = None,
        encoder_prompt: str | None = None,
        encoder_prompt_token_ids: list[int] | None = None,
        num_cached_tokens: int | None = None,
        kv_transfer_params: dict | None = None,
    ):
        self.request_id, self.prompt, self.prompt_token_ids = request_id, prompt, prompt_token_ids
        self.prompt_logprobs, self.outputs, self.finished = prompt_logprobs, outputs, finished
        self.metrics, self.lora_request = metrics, lora_request
        self.encoder_prompt, self.encoder_prompt_token_ids = encoder_prompt, encoder_prompt_token_ids
        self.num_cached_tokens, self.kv_transfer_params = num_cached_tokens, kv_transfer_params

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
            f"prompt_token_ids={self.prompt_token_ids}, outputs={self.outputs}, finished={self.finished})"
        )
