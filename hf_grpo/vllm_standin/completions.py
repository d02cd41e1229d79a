"""The stand-in server's ``POST /v1/completions``: the request read and checked as vLLM does, the answer in its JSON.

``prompt`` is token ids (``list[int]`` or ``list[list[int]]``) or text; ``model`` a served name, an adapter, or
omitted; the sampling fields are those of ``engine.SamplingSpec`` (sample i of a seeded request draws with seed+i),
checked by ``validation.check_sampling`` like the stand-in ``SamplingParams``, plus ``logprobs`` at most
``--max-logprobs`` and a prompt plus ``max_tokens`` within ``--max-model-len``. ``return_token_ids``,
``return_tokens_as_token_ids`` and ``skip_special_tokens`` shape the answer. A bad value is a 400 with vLLM's message;
the fields in ``NOT_IMPLEMENTED_FIELDS`` are a 400 saying so.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import fields
from typing import Any

import torch

from .engine import Sample, SamplingEngine, SamplingSpec
from .errors import ApiError
from .lora import AdapterStore
from .validation import SamplingError, check_sampling


NOT_IMPLEMENTED_FIELDS = (
    "stream",
    "echo",
    "use_beam_search",
    "prompt_logprobs",
    "stop",
    "logprob_token_ids",
    "structured_outputs",
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
)
# field: (default, type) as vLLM's CompletionRequest declares them, which SamplingSpec's defaults are; checked in order
SAMPLING_FIELDS = {
    f.name: (f.default, float if isinstance(f.default, float) else int)
    for f in fields(SamplingSpec)
    if f.name not in ("stop_token_ids", "ignore_eos")
}


def _number(body: dict, key: str, default: Any, kind: type) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ApiError(400, f"1 validation error: `{key}` must be {kind.__name__}, got {value!r}", "Bad Request", key)
    return kind(value)


class CompletionRoute:
    """``POST /v1/completions`` over the engine, the served names and the loaded adapters."""

    def __init__(
        self,
        engine: SamplingEngine,
        adapters: AdapterStore,
        served_model_names: list[str],
        max_logprobs: int,
        max_completion_prompts: int,
    ):
        self.engine, self.adapters, self.served_model_names = engine, adapters, served_model_names
        self.max_logprobs, self.max_completion_prompts = max_logprobs, max_completion_prompts

    def __call__(self, body: Any) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, "1 validation error: the body must be a JSON object", "Bad Request")
        for key in NOT_IMPLEMENTED_FIELDS:
            if body.get(key):
                raise ApiError(400, f"`{key}` is not implemented by hf_grpo's CPU stand-in for vLLM", param=key)
        model, model_name = self.resolve_model(body.get("model"))
        prompts = self.prompts(body.get("prompt"))
        spec = self.sampling(body, prompts)
        as_ids, with_ids = bool(body.get("return_tokens_as_token_ids")), bool(body.get("return_token_ids"))
        skip_special = body.get("skip_special_tokens", True) is not False
        choices: list[dict] = []
        completion_tokens = 0
        with self.engine.lock:
            for prompt in prompts:
                for sample in self.engine.sample(prompt, spec, model=model):
                    completion_tokens += len(sample.token_ids)
                    choices.append(self._choice(len(choices), prompt, sample, spec, as_ids, with_ids, skip_special))
        prompt_tokens = sum(len(p) for p in prompts)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens,
                "prompt_tokens_details": None,
            },
            "kv_transfer_params": None,
        }

    def resolve_model(self, name: Any) -> tuple[torch.nn.Module, str]:
        adapter = self.adapters.get(name) if isinstance(name, str) else None
        if adapter is not None:  # adapters first, as vLLM looks them up
            return adapter.model, name
        if not name or name in self.served_model_names:
            return self.engine.model, name or self.served_model_names[0]
        raise ApiError(404, f"The model `{name}` does not exist.", "NotFoundError", "model")

    def prompts(self, prompt: Any) -> list[list[int]]:
        tokenizer = self.engine.tokenizer
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
            if tokenizer is None:
                raise ApiError(400, "text prompts need a tokenizer in the model directory")
            texts = [prompt] if isinstance(prompt, str) else prompt
            prompts = [tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
            prompts = prompt
        else:
            raise ApiError(400, "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
        if len(prompts) > self.max_completion_prompts:
            raise ApiError(
                400,
                f"prompt list length {len(prompts)} exceeds the maximum allowed count of "
                f"{self.max_completion_prompts}.",
                param="prompt",
            )
        for p in prompts:
            if not p or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
                raise ApiError(
                    400, "1 validation error: prompt token ids must be integers >= 0", "Bad Request", "prompt"
                )
            if max(p) >= self.engine.vocab_size:
                raise ApiError(400, f"Token id {max(p)} is out of vocabulary", param="prompt")
        return prompts

    def sampling(self, body: dict, prompts: list[list[int]]) -> SamplingSpec:
        """The request's ``SamplingSpec``, refused (400) where vLLM refuses it."""
        values = {key: _number(body, key, default, kind) for key, (default, kind) in SAMPLING_FIELDS.items()}
        stop_ids = body.get("stop_token_ids") or []
        if not isinstance(stop_ids, list):
            raise ApiError(
                400, f"1 validation error: `stop_token_ids` must be list[int], got {stop_ids!r}", "Bad Request"
            )
        spec = SamplingSpec(**values, stop_token_ids=stop_ids, ignore_eos=bool(body.get("ignore_eos", False)))
        try:
            check_sampling(spec)
        except SamplingError as exc:
            raise ApiError(400, exc.message, param=exc.field) from None
        spec.stop_token_ids = frozenset(stop_ids)
        limit = self.engine.max_model_len
        if spec.logprobs is not None and self.max_logprobs != -1 and spec.logprobs > self.max_logprobs:
            raise ApiError(
                400,
                f"Requested sample logprobs of {spec.logprobs}, which is greater than max allowed: "
                f"{self.max_logprobs}",
                param="logprobs",
            )
        if spec.max_tokens > limit:
            raise ApiError(
                400,
                f"max_tokens={spec.max_tokens} cannot be greater than max_model_len=max_total_tokens={limit}. Please "
                f"request fewer output tokens. (parameter=max_tokens, value={spec.max_tokens})",
                param="max_tokens",
            )
        longest = max(len(p) for p in prompts)
        if longest + spec.max_tokens > limit:
            raise ApiError(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {spec.max_tokens}. This model's maximum "
                f"context length is {limit} tokens and your request has {longest} input tokens.",
                param="max_tokens",
            )
        return spec

    def _choice(self, index, prompt, sample: Sample, spec, as_ids, with_ids, skip_special) -> dict:
        ids, tokenizer = sample.token_ids, self.engine.tokenizer

        def spell(token: int) -> str:
            return f"token_id:{token}" if as_ids or tokenizer is None else tokenizer.decode([token])

        logprobs = None
        if spec.logprobs is not None:
            tokens = [spell(t) for t in ids]
            offsets = [0, *itertools.accumulate(len(t) for t in tokens)][:-1]  # where each token's text starts
            logprobs = {
                "text_offset": offsets,
                "token_logprobs": [max(lp, -9999.0) for lp in sample.logprobs],
                "tokens": tokens,
                "top_logprobs": [{spell(t): max(lp, -9999.0) for t, lp, _ in step} for step in sample.top_logprobs],
            }
        return {
            "index": index,
            "text": self.engine.decode(ids, skip_special_tokens=skip_special),
            "logprobs": logprobs,
            "finish_reason": sample.finish_reason,
            "stop_reason": sample.stop_reason,
            "token_ids": list(ids) if with_ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": list(prompt) if with_ids else None,
        }
