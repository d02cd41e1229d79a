"""The CPU sampling engine behind both stand-ins: a transformers model and a sampler with vLLM 0.30's semantics.

The server (``server``) and the fake package's ``vllm.LLM`` generate through it (``SamplingEngine``,
``SamplingSpec``, ``Sample``). What it reproduces (processing order, logprobs, seeds, ranks, stopping,
``max_model_len``, ``load_weights``) and what not: docs/vllm_protocol.md. The model runs on the CPU in float32.

    engine = SamplingEngine("path/to/model", logprobs_mode="processed_logprobs", seed=0)
    [sample] = engine.sample([1, 2, 3], SamplingSpec(max_tokens=8, temperature=0.7, logprobs=0))
    sample.token_ids, sample.logprobs, sample.finish_reason
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


SAMPLING_EPS = 1e-5  # vLLM's greedy threshold on temperature
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
UNSUPPORTED_LOGPROBS_MODES = ("raw_logits", "processed_logits")
# Tensors some checkpoints carry that vLLM's loader drops (AutoWeightsLoader's rotary mapper).
SKIPPED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_pos_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


@dataclass
class SamplingSpec:
    """The sampling fields the engine honours, with vLLM's meanings and defaults."""

    n: int = 1
    max_tokens: int | None = 16  # None: until EOS or max_model_len
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_tokens: int = 0
    seed: int | None = None
    logprobs: int | None = None  # None: none; 0: the sampled token; k: and the top k; -1: the whole vocabulary

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


@dataclass
class Sample:
    """One completion: token ids (the stop token included), reported logprobs, and why it ended."""

    token_ids: list[int]
    logprobs: list[float]  # the reported logprob of each sampled token
    top_logprobs: list[list[tuple[int, float, int]]] | None  # per position (token, logprob, rank), sampled first
    finish_reason: str  # "stop" or "length"
    stop_reason: int | None  # the stop token id that ended it (None for EOS and length)


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's shape and float32 values: equal digests mean equal weights, whatever the dtype sent."""
    data = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous()
    digest = hashlib.sha256(str(tuple(data.shape)).encode())
    digest.update(data.numpy().tobytes())
    return digest.hexdigest()


def combined_digest(digests: dict[str, str]) -> str:
    """One sha256 over ``{name: tensor_digest}``: equal when every named tensor is equal."""
    return hashlib.sha256(json.dumps(sorted(digests.items())).encode()).hexdigest()


def env_flag(name: str) -> bool:
    """A boolean environment variable as vLLM reads it: "1" or "true" (any case) is on."""
    return os.environ.get(name, "0").strip().lower() in ("1", "true")


def resolve_max_model_len(text_config, requested: int | None) -> int:
    """vLLM's rule: default to the model's context length; a larger request is an error unless explicitly allowed."""
    derived = getattr(text_config, "max_position_embeddings", None) or 2048
    if requested is None:
        return int(derived)
    if requested < 1:
        raise ValueError(f"max_model_len must be at least 1, got {requested}.")
    if requested > derived and not env_flag("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        raise ValueError(
            f"User-specified max_model_len ({requested}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived} in model's config.json). To allow overriding this maximum, set the "
            "env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
        )
    return int(requested)


@contextlib.contextmanager
def _outside_zero3():
    """Load a whole model even inside a DeepSpeed ZeRO-3 training process.

    Under ``zero3_init_flag`` transformers builds every model in ``deepspeed.zero.Init``, which partitions the
    weights into empty shards. vLLM loads its engine's weights with its own loader, which that context never touches;
    so does the stand-in, by hiding transformers' ZeRO-3 config for the duration of the load.
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved


class SamplingEngine:
    """A causal LM loaded from a directory with transformers (float32, CPU) and a vLLM-like sampler over it.

    ``sample`` and ``load_weights`` take an optional ``model`` (a module with the same architecture, e.g. a model with
    a LoRA adapter merged in); by default they use the engine's own copy. ``lock`` serialises generation and weight
    loading: callers that run requests from several threads hold it around both.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        logprobs_mode: str = "raw_logprobs",
        max_model_len: int | None = None,
        seed: int | None = 0,
        trust_remote_code: bool = False,
        tokenizer: str | os.PathLike | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        """``dtype``: the weights' dtype. float32 gives the trainer's own log-probs back (no sampler/trainer mismatch);
        bfloat16 rounds like a bf16 vLLM engine, so TRL's importance-sampling correction has a mismatch to correct."""
        if logprobs_mode in UNSUPPORTED_LOGPROBS_MODES:
            raise NotImplementedError(f"logprobs_mode {logprobs_mode!r} is not implemented by hf_grpo's CPU stand-in")
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES + UNSUPPORTED_LOGPROBS_MODES}")
        self.model_dir = str(model_dir)
        with _outside_zero3():
            self.model = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=dtype, trust_remote_code=trust_remote_code
            ).eval()
        self.model.requires_grad_(False)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or model_dir, trust_remote_code=trust_remote_code)
        except (OSError, ValueError):
            self.tokenizer = None
        config = self.model.config
        eos: set[int] = set()
        for source in (getattr(self.model.generation_config, "eos_token_id", None), config.eos_token_id):
            eos.update([source] if isinstance(source, int) else (source or []))
        self.eos_ids = frozenset(eos)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.vocab_size = int(text_config.vocab_size)
        self.max_model_len = resolve_max_model_len(text_config, max_model_len)
        self.logprobs_mode, self.seed = logprobs_mode, seed
        self.generator = torch.Generator().manual_seed(0 if seed is None else int(seed) % 2**63)
        self.lock = threading.RLock()

    # Weights

    def parameter_names(self, model: torch.nn.Module | None = None) -> list[str]:
        """The names ``load_weights`` loads (tied aliases excluded), in module order."""
        return [name for name, _ in (model or self.model).named_parameters()]

    def _targets(self, model: torch.nn.Module | None) -> Callable[[str, Sequence[int]], torch.nn.Parameter | None]:
        """``target(name, shape)``: the parameter a weight of that name loads into (None: skipped), or vLLM's error."""
        model = model or self.model
        params = dict(model.named_parameters())  # canonical names; a tied parameter's other names are aliases
        aliases = {name for name, _ in model.named_parameters(remove_duplicate=False)} - set(params)

        def target(name: str, shape: Sequence[int]) -> torch.nn.Parameter | None:
            # vLLM loads a tied pair once (the first name by module traversal) and drops rotary buffers
            param = params.get(name)
            if param is None and (name in aliases or name.endswith(SKIPPED_SUFFIXES)):
                return None
            if param is None:
                raise ValueError(
                    f"There is no module or parameter named {name!r} in {type(model).__name__} "
                    f"(hf_grpo's CPU stand-in loads checkpoint names, e.g. {next(iter(params), '')!r})"
                )
            if tuple(param.shape) != tuple(shape):
                raise AssertionError(
                    f"Attempted to load weight ({torch.Size(shape)}) into parameter ({param.shape}) for {name!r}"
                )
            return param

        return target

    def check_weights(self, names: list[str], shapes: list[list[int]], model: torch.nn.Module | None = None) -> None:
        """Raise as ``load_weights`` would for these names and shapes, without any data."""
        target = self._targets(model)
        for name, shape in zip(names, shapes, strict=True):
            target(name, shape)

    @torch.no_grad()
    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], model: torch.nn.Module | None = None
    ) -> set[str]:
        """Copy each ``(name, tensor)`` into the parameter of that name; returns the canonical names loaded."""
        target = self._targets(model)
        loaded: set[str] = set()
        with self.lock:
            for name, tensor in weights:
                param = target(name, tensor.shape)
                if param is not None:
                    param.data.copy_(tensor.detach().to(device=param.device))
                    loaded.add(name)
        return loaded

    def weight_digests(self, model: torch.nn.Module | None = None) -> dict[str, str]:
        """``tensor_digest`` of every parameter (canonical names)."""
        with self.lock:
            return {name: tensor_digest(p) for name, p in (model or self.model).named_parameters()}

    # Sampling

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def decode_token(self, token_id: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token_id])

    def _process(self, logits: torch.Tensor, prompt: list[int], seqs: list[list[int]], spec: SamplingSpec):
        """The logits vLLM samples from, shapes (n, vocab): min_tokens, penalties, then (random) T, min-p, k, p."""
        logits = logits.clone()
        stops = list(spec.stop_token_ids | (set() if spec.ignore_eos else self.eos_ids))
        for i, seq in enumerate(seqs):
            if len(seq) < spec.min_tokens and stops:
                logits[i, stops] = -float("inf")
            if spec.repetition_penalty != 1.0:
                seen = torch.tensor(sorted(set(prompt) | set(seq)))
                picked = logits[i, seen]
                logits[i, seen] = torch.where(
                    picked > 0, picked / spec.repetition_penalty, picked * spec.repetition_penalty
                )
            if seq and (spec.frequency_penalty or spec.presence_penalty):
                counts = Counter(seq)
                ids = torch.tensor(list(counts))
                freq = torch.tensor([float(c) for c in counts.values()])
                logits[i, ids] -= spec.frequency_penalty * freq + spec.presence_penalty
        if spec.greedy:  # greedy: no temperature and no truncation
            return logits
        logits = logits / spec.temperature
        if spec.min_p > 0:
            probs = logits.softmax(-1)
            logits[probs < spec.min_p * probs.max(-1, keepdim=True).values] = -float("inf")
        if 0 < spec.top_k < logits.shape[-1]:
            kth = logits.topk(spec.top_k, dim=-1).values[:, -1:]
            logits[logits < kth] = -float("inf")
        if spec.top_p < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(-1)
            drop = probs.cumsum(-1) - probs > spec.top_p  # keep the token that crosses top_p
            logits.scatter_(-1, order, sorted_logits.masked_fill(drop, -float("inf")))
        return logits

    def generators(self, spec: SamplingSpec) -> list[torch.Generator]:
        """Sample i of a seeded request draws with seed + i; unseeded samples share the engine's generator."""
        if spec.seed is None:
            return [self.generator] * spec.n
        return [torch.Generator().manual_seed((spec.seed + i) % 2**63) for i in range(spec.n)]

    @torch.no_grad()
    def sample(self, prompt: list[int], spec: SamplingSpec, model: torch.nn.Module | None = None) -> list[Sample]:
        """``spec.n`` completions of one token-id prompt, batched."""
        model = model or self.model
        n = spec.n
        budget = self.max_model_len - len(prompt)
        if budget < 1:
            raise ValueError(
                f"The decoder prompt (length {len(prompt)}) is longer than the maximum model length of "
                f"{self.max_model_len}."
            )
        steps = budget if spec.max_tokens is None else min(spec.max_tokens, budget)
        eos = frozenset() if spec.ignore_eos else self.eos_ids
        with self.lock:
            generators = self.generators(spec)
            out = model(input_ids=torch.tensor([prompt] * n), use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :].float()
            # finish_reason stays "length" until a stop token or EOS ends the sample
            samples = [Sample([], [], [] if spec.logprobs is not None else None, "length", None) for _ in range(n)]
            for step in range(steps):
                processed = self._process(logits, prompt, [sample.token_ids for sample in samples], spec)
                processed_lp = processed.log_softmax(-1)
                reported = logits.log_softmax(-1) if self.logprobs_mode == "raw_logprobs" else processed_lp
                for i, sample in enumerate(samples):
                    if sample.finish_reason == "stop":
                        continue
                    if spec.greedy:
                        token = int(processed[i].argmax())
                    else:
                        token = int(torch.multinomial(processed_lp[i].exp(), 1, generator=generators[i]))
                    sample.token_ids.append(token)
                    sample.logprobs.append(float(reported[i, token]))
                    if sample.top_logprobs is not None:
                        sample.top_logprobs.append(self._top(reported[i], token, sample.logprobs[-1], spec.logprobs))
                    if token in spec.stop_token_ids or token in eos:
                        sample.finish_reason = "stop"
                        sample.stop_reason = token if token in spec.stop_token_ids else None
                if all(sample.finish_reason == "stop" for sample in samples) or step + 1 == steps:
                    break
                feed = torch.tensor([[sample.token_ids[-1]] for sample in samples])  # a finished one repeats its last
                out = model(input_ids=feed, past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[:, -1, :].float()
        return samples

    def _top(self, reported: torch.Tensor, token: int, value: float, k: int) -> list[tuple[int, float, int]]:
        """The sampled token (with its rank) first, then the top k by reported logprob (ranks 1..k)."""
        k = self.vocab_size if k == -1 else min(k, self.vocab_size)
        entries = [(token, value, 1 + int((reported > value).sum()))]
        best = reported.topk(k)
        for rank, (t, lp) in enumerate(zip(best.indices.tolist(), best.values.tolist(), strict=True), start=1):
            if t != token:
                entries.append((t, lp, rank))
        return entries
