"""Each distinct prompt of a GRPO batch runs through the model once, for all the completions that follow it.

A GRPO batch holds ``num_generations`` completions of every prompt, one after another. TRL scores a micro-batch by
running the model on each row's prompt + completion, and on a device without Triton its fused LM head projects every
position onto the vocabulary (49k tokens for SmolLM2), prompt positions included, to keep only the completion's.
``install`` gives the causal LM a forward that does the same work once per prompt:

1. the distinct prompts, all but their last token, run once and fill a KV cache          # [U, P-1]
2. the cache is indexed out to the rows: each row gets its prompt's keys and values       # [R, P-1]
3. the rows run their last prompt token and their completion on it                        # [R, 1+C]
4. only the C positions that predict the completion go through the LM head (TRL's chunked log-prob kernel)

The log-probabilities, entropies and gradients are TRL's to float rounding: the gradient flows back through the
indexed cache into the shared forward (``tests/test_shared_prompts.py`` compares both on the same batch). Under
activation checkpointing a layer drops its cache, so steps 1-3 become one forward of the whole rows there (step 4
still applies). ``generate`` shares the prompt the same way: it prefills the distinct prompts once and samples every
row on the indexed cache, drawing the same random numbers as before; and a row that has ended (its end-of-sequence
token sampled) leaves the cache and the model's forward, while HF generate still samples a padding token for it, so
the random numbers drawn, and with them every other row's tokens, stay the same.

``hf_grpo.GRPOTrainer`` installs it (``shared_prompts: true``, the default) on a text-only model that is not
sharded (ZeRO-3 and FSDP keep TRL's path) and calls the forward from ``_get_per_token_logps_and_entropies``. TRL
shuffles a generation's rows before it cuts them into micro-batches, which scatters a group over several; the
trainer puts each group's rows back side by side (``group_micro_batches``) so that a micro-batch holds whole groups.
"""

from __future__ import annotations

import contextlib
import functools
import types
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.utils import ModelOutput
from trl.kernels import ChunkedLogProbFunction
from trl.trainer.utils import split_tensor_dict


CHUNK = 32768  # vocabulary entries per tile of the log-prob kernel (TRL's own)
SCALED_HEADS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


@dataclass
class CompletionLogps(ModelOutput):  # a ModelOutput: DDP and DeepSpeed look for tensors in what a forward returns
    """What the shared forward returns: per completion token, its log-probability and the policy's entropy there."""

    log_probs: torch.Tensor | None = None  # [R, C], 0 where the completion is padding
    entropy: torch.Tensor | None = None  # [R, C]


def fits(model) -> bool:
    """Whether ``model`` (a causal LM) can take the shared forward: an LM head without the logit scale or softcap
    that TRL's fused head applies and this one does not."""
    config = model.config.get_text_config()
    plain_head = all(getattr(config, name, None) in (None, 1.0) for name in SCALED_HEADS)
    return plain_head and model.get_output_embeddings() is not None


def completion_logps(model, input_ids, attention_mask, completion_length: int, batch_size: int | None, share: bool,
                     autocast=contextlib.nullcontext):  # fmt: skip
    """TRL's ``_get_per_token_logps_and_entropies`` through the shared forward: (log-probs [R, C], entropies [R, C])
    of the last ``completion_length`` tokens of each row, ``batch_size`` rows per call of ``model`` (any wrapper of
    the installed model: DDP, PEFT, DeepSpeed), each distinct prompt run once when ``share``."""
    size, logps, entropies = batch_size or input_ids.size(0), [], []
    for start in range(0, input_ids.size(0), size):
        rows = slice(start, start + size)
        with autocast():
            out = model(
                input_ids=input_ids[rows],
                attention_mask=attention_mask[rows],
                completion_logps=(completion_length, share),
            )
        logps.append(out.log_probs)
        entropies.append(out.entropy)
    return torch.cat(logps), torch.cat(entropies)


def install(model, temperature: float) -> None:
    """Give the causal LM ``model`` (PEFT's base model: what wrappers call into) a forward that takes
    ``completion_logps=(C, share)`` and returns ``CompletionLogps`` of the last C tokens of each row, and a
    ``generate`` that prefills each distinct prompt once. Any other call is the model's own."""
    original_forward, original_generate = model.forward, model.generate

    @functools.wraps(type(model).forward)  # generate checks its keyword arguments against this signature
    def forward(self, *args, completion_logps: tuple[int, bool] | None = None, **kwargs):
        if completion_logps is None and getattr(self, "_live_rows", None) is not None and not args:
            return _live_rows_forward(self._live_rows, original_forward, kwargs)
        if completion_logps is None:
            return original_forward(*args, **kwargs)
        return _completion_logps(self, kwargs["input_ids"], kwargs["attention_mask"], *completion_logps, temperature)

    @functools.wraps(type(model).generate)
    def generate(self, *args, **kwargs):
        return _shared_generate(self, original_generate, *args, **kwargs)

    model.forward = types.MethodType(forward, model)
    model.generate = types.MethodType(generate, model)


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the first row of each distinct prompt [U], the distinct prompt each row has [R]), wherever the rows repeat
    a prompt: a micro-batch TRL shuffled holds its prompts' rows in any order."""
    rows = torch.cat([prompt_ids, prompt_mask], 1)  # [R, 2P]: the same ids with other padding are another prompt
    distinct, which = torch.unique(rows, dim=0, return_inverse=True)  # [U, 2P], [R] in 0..U-1
    order = torch.arange(rows.size(0), device=rows.device)  # [R]
    first = order.new_full((distinct.size(0),), rows.size(0)).scatter_reduce(0, which, order, "amin")  # [U]
    return first, which


def group_order(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """A row order [R] that puts the rows of each distinct prompt side by side, prompts in the order of their first
    row: applied to a batch TRL shuffled, it keeps the shuffled order of the groups."""
    first, which = prompt_groups(prompt_ids, prompt_mask)
    return torch.sort(first[which], stable=True).indices  # by each row's prompt's first row


def group_micro_batches(batches: list[dict]) -> list[dict]:
    """TRL's micro-batches of one generation (``_buffered_inputs``: rows shuffled across them) with their rows
    reordered so that each prompt's rows sit side by side, groups in their shuffled order: a micro-batch then holds
    whole groups, whose prompt the shared forward runs once. The same rows, the same sizes: with TRL's losses, which
    sum the micro-batches' terms, the same update to float rounding."""
    merged = {}
    for key, first in batches[0].items():
        if first is None or (isinstance(first, torch.Tensor) and first.ndim == 0):
            merged[key] = first  # per micro-batch values TRL copies into each (num_items_in_batch)
        elif isinstance(first, torch.Tensor):
            merged[key] = torch.cat([batch[key] for batch in batches])
        else:
            merged[key] = [row for batch in batches for row in batch[key]]
    order = group_order(merged["prompt_ids"], merged["prompt_mask"])  # [R]
    for key, value in merged.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            merged[key] = value[order.to(value.device)]
        elif isinstance(value, list):
            merged[key] = [value[i] for i in order.tolist()]
    return split_tensor_dict(merged, len(batches))


def _prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, positions: bool, always: bool = False):
    """A cache of every row's prompt but its last token, computed once per distinct prompt and indexed out to the
    rows (a ``DynamicCache``); None when nothing repeats, unless ``always``, or when a prompt is one token.
    ``positions``: count positions from each row's first real token, as generate does (else from the first column,
    as a plain forward and TRL's scoring do: either way the same distances between real tokens, which is all rotary
    positions see)."""
    first, which = prompt_groups(prompt_ids, prompt_mask)
    if (first.numel() == prompt_ids.size(0) and not always) or prompt_ids.size(1) < 2:
        return None
    ids, mask = prompt_ids[first, :-1], prompt_mask[first, :-1]  # [U, P-1]
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1) if positions else None  # generate's rule
    cache = DynamicCache(config=model.config)
    model.base_model(input_ids=ids, attention_mask=mask, position_ids=position_ids, cache=cache, use_cache=True)
    _select_rows(cache, which)  # [U, ...] -> [R, ...]; differentiable, so the gradient reaches the prefill
    return cache


def _select_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """``cache.batch_select_indices(rows)`` with ``index_select`` where transformers indexes (``keys[rows, ...]``):
    the same values, but the gradient of a repeated row is summed by ``index_add_``, which on a CPU adds in a fixed
    order, where indexing's backward (``index_put_`` with accumulate) adds from several threads in whatever order
    they run, so the same batch gave a different gradient in its last bits on every call with 2 threads."""
    for layer in cache.layers:
        if type(layer).batch_select_indices is DynamicLayer.batch_select_indices and layer.get_seq_length() > 0:
            layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
        else:  # a layer with more state than keys and values (a sparse-attention indexer's): transformers' own
            layer.batch_select_indices(rows)


def _completion_logps(model, input_ids, attention_mask, completion_length: int, share: bool, temperature: float):
    """The shared forward: the log-probabilities and entropies of the last ``completion_length`` tokens of each row."""
    prompt_length = input_ids.size(1) - completion_length  # P
    cache = _prefill(model, input_ids[:, :prompt_length], attention_mask[:, :prompt_length], False) if share else None
    if cache is not None:
        suffix = input_ids[:, prompt_length - 1 :]  # [R, 1+C]: the last prompt token, then the completion
        hidden = model.base_model(
            input_ids=suffix, attention_mask=attention_mask, cache=cache, use_cache=True
        ).last_hidden_state
        hidden = hidden[:, :-1]  # [R, C, H]
    else:
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        hidden = hidden[:, prompt_length - 1 : -1]  # [R, C, H]
    targets = input_ids[:, prompt_length:]  # [R, C]
    head = model.get_output_embeddings()
    log_probs, entropy, *_ = ChunkedLogProbFunction.apply(
        hidden.reshape(-1, hidden.size(-1)), head.weight, head.bias, targets.reshape(-1), temperature, CHUNK,
        None, 1.0, ("entropy",),
    )  # fmt: skip
    padding = attention_mask[:, prompt_length:] == 0  # [R, C]
    return CompletionLogps(
        log_probs=log_probs.view_as(targets).masked_fill(padding, 0), entropy=entropy.view_as(targets)
    )


def _shared_generate(model, original_generate, input_ids=None, attention_mask=None, **kwargs):
    """``generate`` with each distinct prompt prefilled once: the rows continue from the indexed cache, and a row
    that ended leaves the forward (``LiveRows``; for that the prompts are prefilled even when none repeats). Left
    as it is for a call that brings its own cache or cache implementation."""
    config = kwargs.get("generation_config") or model.generation_config
    own_cache = any(kwargs.get(name) is not None for name in ("cache", "past_key_values", "inputs_embeds"))
    if input_ids is None or attention_mask is None or own_cache or config.cache_implementation is not None:
        return original_generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    eos, pad = (kwargs.get(name, getattr(config, name)) for name in ("eos_token_id", "pad_token_id"))
    one_each = (kwargs.get("num_return_sequences") or config.num_return_sequences or 1) == 1
    # (on mps HF generate runs one step past the end and undoes it on the cache: every row stays there)
    live_rows = eos is not None and pad is not None and one_each and input_ids.device.type != "mps"
    with torch.no_grad():
        cache = _prefill(model, input_ids, attention_mask, True, always=live_rows)
    if cache is None:
        return original_generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    kwargs["cache"] = cache
    if live_rows:
        model._live_rows = LiveRows(cache, _ids(eos), pad, input_ids.size(0))
    try:
        return original_generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    finally:
        model._live_rows = None


def _ids(value) -> torch.Tensor:
    return torch.tensor(value if isinstance(value, (list, tuple)) else [value])


@dataclass
class LiveRows:
    """The rows of one ``generate`` call still sampling, and the cache that holds only theirs."""

    cache: DynamicCache
    eos: torch.Tensor  # [E] the config's end-of-sequence ids: a row fed one of them has ended
    pad: int  # what HF generate feeds an ended row from then on
    rows: int  # R, the rows of the call
    live: torch.Tensor | None = None  # [L] row numbers in the cache, in its order; None until the first decode step


def _live_rows_forward(state: LiveRows, original_forward, kwargs: dict):
    """One forward of HF generate on the rows that have not ended; an ended row's logits are zeros (HF generate
    samples from them with the same random numbers as ever and then writes the padding token in its place)."""
    input_ids = kwargs.get("input_ids")
    per_row = ("input_ids", "attention_mask", "position_ids")
    if input_ids is None or kwargs.get("cache") is not state.cache or input_ids.size(1) != 1:
        return original_forward(**kwargs)  # not a decode step of this call's cache
    tokens = input_ids[:, 0].cpu()  # [R]
    if state.live is None:  # the first step feeds every row its last prompt token
        state.live = torch.arange(state.rows)
    else:
        gone = torch.ones(state.rows, dtype=torch.bool)
        gone[state.live] = False
        if (tokens[gone] != state.pad).any():
            raise RuntimeError(
                "hf_grpo.shared_prompts: generate went on sampling a row after its end-of-sequence token; the "
                "generation config's eos_token_id is not the one generate stops on: set shared_prompts: false"
            )
        ended = torch.isin(tokens[state.live], state.eos)  # [L]
        if ended.any():
            keep = (~ended).nonzero().squeeze(1)
            state.cache.batch_select_indices(keep.to(input_ids.device))
            state.live = state.live[keep]
    if state.live.numel() == 0:
        raise RuntimeError("hf_grpo.shared_prompts: generate asked for a step after every row ended")
    live = state.live.to(input_ids.device)
    out = original_forward(**{k: v[live] if k in per_row and v is not None else v for k, v in kwargs.items()})
    logits = out.logits.new_zeros(state.rows, *out.logits.shape[1:])  # [R, 1, V]
    logits[live] = out.logits
    out.logits = logits
    return out
