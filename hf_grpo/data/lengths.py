"""Prompts too long for the context, found before training: dropped or cut from the left (``long_prompts``).

A prompt plus ``max_completion_length`` tokens must fit the context: a vLLM server answers a longer request with
HTTP 400 (which would end the run at the first such batch), and a model attends to ``max_position_embeddings``
positions at most. ``fit_prompts`` measures every prompt as GRPOTrainer tokenizes it and drops the long ones or
keeps their last tokens, and says how many.
"""

from __future__ import annotations

import logging

from ..base.progress import progress_bar
from ..evaluation.core import prompt_token_ids
from .loaders import LONG_PROMPTS


logger = logging.getLogger(__name__)

CHUNK = 1000  # prompts tokenized per call


RUN_CONTEXT = "generation.max_model_len, else the model's max_position_embeddings"  # what a run measures against


def prompt_budget(
    context: int | None, max_completion_length: int, key: str = "max_completion_length", source: str = RUN_CONTEXT
) -> int | None:
    """The most prompt tokens that leave room for a whole completion; None when the context is unknown. A
    ``ValueError`` names ``key`` (the setting that gave the completion length) and ``source`` (where the context
    came from) when there is no room: the recipe check, a run and ``hf-grpo eval --max-new-tokens`` all ask here."""
    if not context:
        return None
    if context <= max_completion_length:
        raise ValueError(
            f"{key} {max_completion_length} leaves no room for a prompt in a context of {context} tokens ({source}): "
            f"lower {key} below {context}"
        )
    return context - max_completion_length


def context_limits(config) -> tuple[int, int] | None:
    """(max_position_embeddings, the longest max_model_len vLLM allows: that times a rope scaling factor) of a model
    config (its text config for a multimodal one); None when it names no context."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    context = getattr(config, "max_position_embeddings", None)
    if not isinstance(context, int) or context < 1:
        return None
    scaling = getattr(config, "rope_scaling", None) or {}
    kind, factor = scaling.get("rope_type", scaling.get("type")), scaling.get("factor")
    if kind in ("su", "longrope", "llama3") or not isinstance(factor, (int, float)) or factor < 1:
        return context, context  # vLLM's rule (_get_and_verify_max_len): these already count the scaling
    base = scaling.get("original_max_position_embeddings", context) if kind == "yarn" else context
    return context, int(base * factor)


def prompt_lengths(
    tokenizer, prompts: list, progress: bool | None = None, chat_template_kwargs: dict | None = None
) -> list[int]:
    """Each prompt's length in tokens, as GRPOTrainer builds its ids (``prompt_token_ids``: special tokens such as
    BOS included, chat template with the recipe's ``chat_template_kwargs`` for a message list)."""
    lengths = []
    with progress_bar(total=len(prompts), desc="measuring prompts", unit="prompt", enabled=progress) as bar:
        for start in range(0, len(prompts), CHUNK):
            chunk = prompts[start : start + CHUNK]
            if all(isinstance(p, str) for p in chunk):  # one batched call for text prompts, as TRL's
                lengths += [len(ids) for ids in tokenizer(text=chunk)["input_ids"]]
            else:
                lengths += [len(prompt_token_ids(tokenizer, p, chat_template_kwargs)) for p in chunk]
            bar.update(len(chunk))
    return lengths


def shortened(tokenizer, prompt, limit: int, chat_template_kwargs: dict | None = None):
    """The prompt with tokens cut from its left until it fits ``limit``, in its own form: text keeps its tail; a chat
    prompt keeps its messages and template and loses the start of its contents, the first message's first (the
    system prompt goes before the question). None when even that cannot fit."""
    for _ in range(4):  # decoding and re-tokenizing can merge tokens differently: measure again
        excess = len(prompt_token_ids(tokenizer, prompt, chat_template_kwargs)) - limit
        if excess <= 0:
            return prompt
        if isinstance(prompt, str):
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            prompt = tokenizer.decode(ids[excess:]) if excess < len(ids) else None
        else:
            prompt = _cut_messages(tokenizer, prompt, excess)
        if prompt is None:
            return None
    return None


def _cut_messages(tokenizer, messages: list[dict], excess: int) -> list[dict] | None:
    """``messages`` with ``excess`` tokens cut from the start of their contents, first message first; None when the
    contents hold fewer tokens than that (the template alone is too long) or are not text."""
    cut = []
    for message in messages:
        text = message.get("content")
        if not isinstance(text, str):
            return None
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        drop = min(excess, len(ids))
        excess -= drop
        cut.append({**message, "content": tokenizer.decode(ids[drop:]) if drop else text})
    return None if excess > 0 else cut


def fit_prompts(
    dataset,
    tokenizer,
    max_prompt_tokens: int,
    mode: str,
    name: str,
    progress: bool | None = None,
    chat_template_kwargs: dict | None = None,
):
    """``(dataset, number dropped, number truncated)``: ``dataset`` with every prompt within ``max_prompt_tokens``,
    measured as TRL tokenizes them (``prompt_lengths``).

    ``mode`` ``drop`` removes the long prompts' rows; ``truncate_left`` cuts each from the left (``shortened``) and
    drops only those that cannot be cut to fit. A dataset left with no prompt at all is a ``ValueError``.
    """
    if mode not in LONG_PROMPTS:
        raise ValueError(f"long_prompts must be one of {', '.join(LONG_PROMPTS)}, got {mode!r}")
    lengths = prompt_lengths(tokenizer, dataset["prompt"], progress, chat_template_kwargs)
    long_rows = [i for i, n in enumerate(lengths) if n > max_prompt_tokens]
    if not long_rows:
        return dataset, 0, 0
    cut = {}
    if mode == "truncate_left":
        prompts = zip(long_rows, dataset.select(long_rows)["prompt"], strict=True)
        cut = {i: shortened(tokenizer, p, max_prompt_tokens, chat_template_kwargs) for i, p in prompts}
    dropped = [i for i in long_rows if cut.get(i) is None]
    if len(dropped) < len(long_rows):
        dataset = dataset.map(
            lambda row, i: {"prompt": cut[i]} if cut.get(i) is not None else {"prompt": row["prompt"]},
            with_indices=True,
            desc="truncating prompts",
        )
    if dropped:
        dataset = dataset.select(sorted(set(range(len(lengths))) - set(dropped)))
    truncated = len(long_rows) - len(dropped)
    if len(dropped) == len(lengths):
        raise ValueError(
            f"{name}: every prompt is longer than {max_prompt_tokens} tokens (the context less max_completion_length, "
            f"{mode}): raise generation.max_model_len, lower max_completion_length, or set long_prompts: truncate_left"
        )
    logger.warning(
        "%s: %d of %d prompts are longer than %d tokens (the context less max_completion_length): %s",
        name,
        len(long_rows),
        len(lengths),
        max_prompt_tokens,
        f"dropped {len(dropped)}, truncated {truncated} (long_prompts: {mode})",
    )
    return dataset, len(dropped), truncated
