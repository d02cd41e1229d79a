"""Each distinct prompt of a GRPO batch runs through the model once, for all the completions that follow it.

A GRPO batch holds ``num_generations`` completions of every prompt. TRL scores a micro-batch by running the model on
each row's prompt + completion, and on a device without Triton its fused LM head projects every position onto the
vocabulary (49k tokens for SmolLM2), prompt positions included, to keep only the completion's. ``install`` gives the
causal LM a forward that does the same work once per prompt:

1. the distinct prompts, all but their last token, run once and fill a KV cache          # [U, P-1]
2. the cache is indexed out to the rows: each row gets its prompt's keys and values       # [R, P-1]
3. the rows run their last prompt token and their completion on it, through TRL's own fused forward, whose LM head
   sees only these 1+C positions (TRL's ``shift_labels``: the labels of the completion, -100 elsewhere)  # [R, 1+C]

The head is TRL's: its temperature, logit scale and softcap, ``cast_lm_head_to_fp32`` (the head in float32 outside
autocast), the hidden states moved to the head's device, log-probabilities and entropies zero at padding. So the
numbers and gradients are TRL's to float rounding; the gradient flows back through the indexed cache into the shared
forward (``tests/test_shared_prompts.py`` and ``tests/test_fast_path_equivalence.py`` compare both). A prompt of one
token, or a layer under activation checkpointing (which drops its cache), takes TRL's path unchanged.

``generate`` shares the prompt the same way (greedy, or sampling one sequence a row, with the same random numbers);
a row that has ended leaves the model's forward while HF still samples its padding. Beam search and the like stay HF's.
``hf_grpo.GRPOTrainer`` installs it (``shared_prompts: true``) on an unsharded text model's policy and reference.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from accelerate.utils import is_peft_model
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.generation.configuration_utils import GenerationMode


logger = logging.getLogger(__name__)

SHARED_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)  # generate's modes that take the shared prefill


def fits(model) -> str | None:
    """Why the causal LM ``model`` cannot take the shared forward, or None when it can: it needs TRL's fused LM head
    (``trl.trainer.utils.add_fused_lm_head``, which GRPOTrainer installs) and an output embedding."""
    if model.get_output_embeddings() is None:
        return "the model has no output embedding (LM head)"
    code = getattr(getattr(model.forward, "__func__", None), "__code__", None)
    if code is None or "fused_lm_head" not in code.co_varnames:
        return "the model's forward is not TRL's fused LM head (trl.trainer.utils.add_fused_lm_head)"
    return None


def install_in(trainer) -> bool:
    """Install the shared forward in ``trainer``'s policy and reference model (``shared_prompts: true``) where they
    allow it; else TRL's forward stays, and one line says why. Returns whether it did."""
    if not trainer.args.shared_prompts:
        return False
    models = [trainer.model.get_base_model() if is_peft_model(trainer.model) else trainer.model]
    if trainer.ref_model is not None:
        models.append(trainer.accelerator.unwrap_model(trainer.ref_model))
    zero3 = trainer.is_deepspeed_enabled and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3
    reasons = [
        zero3 and "ZeRO-3 shards the parameters",
        trainer.is_fsdp_enabled and "FSDP shards the parameters",
        trainer._is_vlm and "a vision-language model",
        *map(fits, models),
    ]
    reason = next((why for why in reasons if why), None)
    if reason:
        logger.info("shared_prompts: off (%s): the completions are scored with TRL's forward", reason)
        return False
    for model in models:
        install(model)
    return True


def completion_logps(model, input_ids, attention_mask, completion_length: int, batch_size: int | None,
                     autocast=contextlib.nullcontext):  # fmt: skip
    """TRL's ``_get_per_token_logps_and_entropies`` through the shared forward: (log-probs [R, C], entropies [R, C]
    or None where the model's fused head computes none) of the last ``completion_length`` tokens of each row,
    ``batch_size`` rows per call of ``model`` (any wrapper of the installed model: DDP, PEFT, DeepSpeed)."""
    size, logps, entropies = batch_size or input_ids.size(0), [], []
    for start in range(0, input_ids.size(0), size):
        rows = slice(start, start + size)
        with autocast():
            out = model(
                input_ids=input_ids[rows], attention_mask=attention_mask[rows], completion_logps=completion_length
            )
        logps.append(out.log_probs)
        entropies.append(out.entropy)
    return torch.cat(logps), None if entropies[0] is None else torch.cat(entropies)


def install(model) -> None:
    """Give the causal LM ``model`` (PEFT's base model: what wrappers call into), whose forward is TRL's fused head, a
    forward that takes ``completion_logps=C`` and returns TRL's output for the last C tokens of each row, and a
    ``generate`` that prefills each distinct prompt once. Any other call is the model's own."""
    fused_forward, original_generate = model.forward, model.generate

    @functools.wraps(type(model).forward)  # generate checks its keyword arguments against this signature
    def forward(self, *args, completion_logps: int | None = None, **kwargs):
        if completion_logps is None and getattr(self, "_live_rows", None) is not None and not args:
            return _live_rows_forward(self._live_rows, fused_forward, kwargs)
        if completion_logps is None:
            return fused_forward(*args, **kwargs)
        return _completion_logps(self, fused_forward, kwargs["input_ids"], kwargs["attention_mask"], completion_logps)

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


def _completion_logps(model, fused_forward, input_ids, attention_mask, completion_length: int):
    """The shared forward: TRL's fused-head output (``log_probs``, ``entropy``) for the last ``completion_length``
    tokens of each row [R, C], each distinct prompt run once."""
    prompt_length = input_ids.size(1) - completion_length  # P
    targets = input_ids[:, prompt_length:].masked_fill(attention_mask[:, prompt_length:] == 0, -100)  # [R, C]
    cache = _prefill(model, input_ids[:, :prompt_length], attention_mask[:, :prompt_length], False, always=True)
    if cache is None:  # a one-token prompt: TRL's own call on whole rows
        labels = F.pad(targets, (prompt_length, 0), value=-100)  # [R, P+C]
        out = fused_forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        cut = slice(-completion_length, None)  # TRL's log_probs cover positions 1..P+C-1
    else:
        suffix = input_ids[:, prompt_length - 1 :]  # [R, 1+C]: the last prompt token, then the completion
        shift_labels = F.pad(targets, (0, 1), value=-100)  # [R, 1+C]: position i predicts suffix[i+1]
        out = fused_forward(
            input_ids=suffix, attention_mask=attention_mask, cache=cache, shift_labels=shift_labels, fused_lm_head=True
        )
        cut = slice(None, -1)  # the last suffix position predicts nothing
    out.log_probs = out.log_probs[:, cut]
    out.entropy = None if out.entropy is None else out.entropy[:, cut]
    return out


def _shared_generate(model, original_generate, input_ids=None, attention_mask=None, **kwargs):
    """``generate`` with each distinct prompt prefilled once: the rows continue from the indexed cache, and a row
    that ended leaves the forward (``LiveRows``; for that the prompts are prefilled even when none repeats). HF's own
    for anything but greedy decoding or sampling of one sequence per row, and for a call that brings its own cache
    or cache implementation."""
    config = copy.deepcopy(kwargs.get("generation_config") or model.generation_config)
    config.update(**{k: v for k, v in kwargs.items() if k != "generation_config"})  # what generate will run
    own_cache = any(kwargs.get(name) is not None for name in ("cache", "past_key_values", "inputs_embeds"))
    plain = config.get_generation_mode(kwargs.get("assistant_model")) in SHARED_MODES
    if (
        input_ids is None
        or attention_mask is None
        or own_cache
        or config.cache_implementation is not None
        or not plain
        or (config.num_return_sequences or 1) != 1  # generate repeats each row: the cache would not
    ):
        return original_generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    eos, pad = config.eos_token_id, config.pad_token_id
    # (on mps HF generate runs one step past the end and undoes it on the cache: every row stays there)
    live_rows = eos is not None and pad is not None and input_ids.device.type != "mps"
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
                "hf_grpo.training.shared_prompts: generate went on sampling a row after its end-of-sequence token; the "
                "generation config's eos_token_id is not the one generate stops on: set shared_prompts: false"
            )
        ended = torch.isin(tokens[state.live], state.eos)  # [L]
        if ended.any():
            keep = (~ended).nonzero().squeeze(1)
            state.cache.batch_select_indices(keep.to(input_ids.device))
            state.live = state.live[keep]
    if state.live.numel() == 0:
        raise RuntimeError("hf_grpo.training.shared_prompts: generate asked for a step after every row ended")
    live = state.live.to(input_ids.device)
    out = original_forward(**{k: v[live] if k in per_row and v is not None else v for k, v in kwargs.items()})
    logits = out.logits.new_zeros(state.rows, *out.logits.shape[1:])  # [R, 1, V]
    logits[live] = out.logits
    out.logits = logits
    return out
