"""vLLM 0.30's offline ``LLM`` (``vllm/entrypoints/llm.py``) for the stand-in: a transformers model on the CPU.

``LLM(model=DIR, ...)`` takes the arguments TRL 1.16's colocate mode passes, loads the model with transformers
(float32) and samples with ``hf_grpo.vllm_standin.engine``. ``generate``, ``load_weights`` through
``llm_engine.model_executor``, ``sleep`` / ``wake_up`` and the rest TRL reaches work as in vLLM; what it did is
counted in ``LLM.standin_stats``. Arguments, checks and what is not provided: docs/vllm_protocol.md.
"""

import itertools
import logging
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from hf_grpo.vllm_standin.engine import SamplingEngine
from vllm.exceptions import VLLMValidationError
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams


logger = logging.getLogger(__name__)

SLEEP_TAGS = frozenset(("weights", "kv_cache"))
# EngineArgs fields the stand-in accepts and ignores (no meaning on one CPU, or defaults it cannot change).
NO_EFFECT_KWARGS = frozenset(
    (
        "max_num_seqs",
        "max_num_batched_tokens",
        "distributed_executor_backend",
        "model_impl",
        "enforce_eager",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "disable_log_stats",
        "disable_custom_all_reduce",
        "kv_cache_dtype",
        "kv_cache_memory_bytes",
        "block_size",
        "swap_space",
        "cpu_offload_gb",
        "pipeline_parallel_size",
        "data_parallel_size",
        "max_logprobs",
        "worker_extension_cls",
        "compilation_config",
        "load_format",
        "download_dir",
        "revision",
        "tokenizer_revision",
        "tokenizer_mode",
        "hf_token",
        "hf_overrides",
    )
)


class ModelConfig:
    """The fields of vLLM's ``ModelConfig`` that callers read."""

    def __init__(self, model: str, max_model_len: int, logprobs_mode: str, seed: int, enable_sleep_mode: bool):
        self.model, self.max_model_len, self.logprobs_mode = model, max_model_len, logprobs_mode
        self.seed, self.enable_sleep_mode = seed, enable_sleep_mode
        self.runner_type, self.dtype = "generate", torch.float32


class ParallelConfig:
    def __init__(self, tensor_parallel_size: int):
        self.tensor_parallel_size, self.pipeline_parallel_size, self.data_parallel_size = tensor_parallel_size, 1, 1
        self.world_size = self.world_size_across_dp = tensor_parallel_size


class VllmConfig:
    def __init__(self, model_config: ModelConfig, parallel_config: ParallelConfig):
        self.model_config, self.parallel_config = model_config, parallel_config


class StandInModel:
    """What ``driver_worker.model_runner.model`` is to TRL: ``load_weights`` by checkpoint name, over the engine's
    copy of the model (also reachable as ``hf_model``, with ``named_parameters``)."""

    def __init__(self, llm_engine: "LLMEngine"):
        self._llm_engine = llm_engine
        self.hf_model = llm_engine.engine.model
        self.config = self.hf_model.config

    def load_weights(self, weights) -> set[str]:
        return self._llm_engine.load_weights(weights)

    def named_parameters(self, *args, **kwargs):
        return self.hf_model.named_parameters(*args, **kwargs)

    def parameters(self, *args, **kwargs):
        return self.hf_model.parameters(*args, **kwargs)


class ModelRunner:
    def __init__(self, model: StandInModel):
        self.model = model


class Worker:
    def __init__(self, model_runner: ModelRunner):
        self.model_runner = model_runner


class Executor:
    def __init__(self, llm_engine: "LLMEngine"):
        self.driver_worker = Worker(ModelRunner(StandInModel(llm_engine)))
        self._llm_engine = llm_engine

    @property
    def is_sleeping(self) -> bool:
        return bool(self._llm_engine.sleeping_tags)


class LLMEngine:
    """The engine behind ``LLM``: the sampling engine, the configs, the sleep state and the counters."""

    def __init__(self, engine: SamplingEngine, vllm_config: VllmConfig, enable_sleep_mode: bool):
        self.engine, self.vllm_config = engine, vllm_config
        self.model_config = vllm_config.model_config
        self.enable_sleep_mode = enable_sleep_mode
        self.sleeping_tags: set[str] = set()
        self.paused = False
        self.discarded: set[str] = set()  # weights discarded by sleep(level=2) and not loaded since
        self.stats: Counter[str] = Counter()
        self.model_executor = Executor(self)

    def get_tokenizer(self):
        return self.engine.tokenizer

    def load_weights(self, weights) -> set[str]:
        if "weights" in self.sleeping_tags:
            raise RuntimeError(
                "load_weights() while the weights sleep: call wake_up(tags=['weights']) first (vLLM would write to "
                "released memory)"
            )
        weights = list(weights)
        loaded = self.engine.load_weights(weights)
        self.discarded -= loaded
        self.stats["load_weights_calls"] += 1
        self.stats["tensors_loaded"] += len(weights)
        return loaded

    def check_ready(self) -> None:
        if self.sleeping_tags or self.paused:
            asleep = sorted(self.sleeping_tags) or ["scheduling"]
            raise RuntimeError(
                f"generate() while the engine sleeps ({asleep}): call wake_up() first; vLLM would not schedule the "
                "requests"
            )
        if self.discarded:
            total = len(self.engine.parameter_names())
            raise RuntimeError(
                f"sleep(level=2) discarded the weights and {len(self.discarded)} of {total} tensors have not been "
                f"loaded since (e.g. {min(self.discarded)!r}): load every weight (TRL's sync_weights) before "
                "generating"
            )

    def sleep(self, level: int) -> None:
        if not self.enable_sleep_mode:
            raise RuntimeError(
                "Sleep mode is not enabled: create the LLM with enable_sleep_mode=True (vLLM would free nothing; "
                "hf_grpo's CPU stand-in refuses instead)"
            )
        if level not in (0, 1, 2):
            raise ValueError(f"sleep level must be 0, 1 or 2, got {level}")
        self.paused = True
        if level == 0:
            return
        if "weights" in self.sleeping_tags:
            logger.warning("Executor is already sleeping.")
            return
        self.sleeping_tags |= SLEEP_TAGS
        self.stats[f"sleep_level_{level}"] += 1
        if level == 2:  # the weights are gone: poison them so that nothing can use them unnoticed
            with torch.no_grad(), self.engine.lock:
                for p in self.engine.model.parameters():
                    p.fill_(float("nan"))
            self.discarded = set(self.engine.parameter_names())

    def wake_up(self, tags: list[str] | None = None) -> None:
        if tags is not None:
            unknown = set(tags) - SLEEP_TAGS - {"scheduling"}
            if unknown:
                raise ValueError(
                    f"wake_up tags must be in ('weights', 'kv_cache', 'scheduling'), got {sorted(unknown)}"
                )
            tags = [t for t in tags if t != "scheduling"]
        if tags is None:
            self.sleeping_tags.clear()
        elif tags:
            missing = [t for t in tags if t not in self.sleeping_tags]
            if missing:
                logger.warning("Tag %s is not in sleeping tags %s", missing[0], sorted(self.sleeping_tags))
                return
            self.sleeping_tags -= set(tags)
        if not self.sleeping_tags:
            self.paused = False

    def is_sleeping(self) -> bool:
        return bool(self.sleeping_tags) or self.paused


class LLM:
    """An LLM on the CPU with vLLM 0.30's offline interface (see the module docstring for what is honoured)."""

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        quantization: str | None = None,
        seed: int = 0,
        gpu_memory_utilization: float = 0.92,
        max_model_len: int | None = None,
        enable_sleep_mode: bool = False,
        logprobs_mode: str = "raw_logprobs",
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - NO_EFFECT_KWARGS)
        if unknown:
            raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument {unknown[0]!r}")
        if quantization is not None:
            raise NotImplementedError(f"quantization={quantization!r}: hf_grpo's CPU stand-in runs float32 weights")
        if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be at least 1, got {tensor_parallel_size}")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if kwargs.get("data_parallel_size", 1) != 1:
            raise ValueError("LLM(data_parallel_size>1) is not supported for single-process usage")
        engine = SamplingEngine(
            model,
            logprobs_mode=logprobs_mode,
            max_model_len=max_model_len,
            seed=seed,
            trust_remote_code=trust_remote_code,
            tokenizer=tokenizer,
        )
        if skip_tokenizer_init:
            engine.tokenizer = None
        notes = [f"tensor_parallel_size={tensor_parallel_size}"] if tensor_parallel_size > 1 else []
        notes += [f"gpu_memory_utilization={gpu_memory_utilization}"]
        notes += [f"dtype={dtype}"] if dtype not in ("auto", "float32", "float") else []
        notes += [f"{k}={v!r}" for k, v in sorted(kwargs.items())]
        logger.info("hf_grpo CPU stand-in for vllm.LLM(%s): no effect on CPU: %s", model, ", ".join(notes))
        model_config = ModelConfig(str(model), engine.max_model_len, logprobs_mode, seed, enable_sleep_mode)
        self.llm_engine = LLMEngine(
            engine, VllmConfig(model_config, ParallelConfig(tensor_parallel_size)), enable_sleep_mode
        )
        self.model_config = model_config
        self.standin_stats = self.llm_engine.stats
        self._request_ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def get_world_size(self, include_dp: bool = True) -> int:
        config = self.llm_engine.vllm_config.parallel_config
        return config.world_size_across_dp if include_dp else config.world_size

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.standin_stats["reset_prefix_cache"] += 1
        return True

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if mode not in ("abort", "wait", "keep"):
            raise ValueError(f"mode must be 'abort', 'wait' or 'keep', got {mode!r}")
        self.llm_engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.llm_engine.wake_up(tags)

    def _prompt_ids(self, prompt: Any, tokenization_kwargs: dict | None) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if prompt.get("multi_modal_data") is not None:
                raise NotImplementedError("multimodal prompts: not implemented by hf_grpo's CPU stand-in for vLLM")
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt")
        if not isinstance(prompt, str):
            raise TypeError(
                f"a prompt is a str, {{'prompt': str}} or {{'prompt_token_ids': list[int]}}, got {prompt!r}"
            )
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer (skip_tokenizer_init=True was given)")
        return prompt, tokenizer(prompt, **(tokenization_kwargs or {}))["input_ids"]

    def _validate_prompt(self, ids: list[int]) -> None:
        """vLLM's input checks (``v1/engine/input_processor.py``)."""
        engine = self.llm_engine.engine
        if not ids:
            raise VLLMValidationError("The decoder prompt cannot be empty")
        for token in (min(ids), max(ids)):
            if not 0 <= token < engine.vocab_size:
                raise VLLMValidationError(f"Token id {token} is out of vocabulary")
        limit = engine.max_model_len
        if len(ids) > limit:
            raise VLLMValidationError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of {limit}. Make "
                "sure that `max_model_len` is no smaller than the number of text tokens."
            )
        if len(ids) == limit:
            raise VLLMValidationError(
                f"The decoder prompt (length {len(ids)}) plus the number of requested output tokens (at least 1) is "
                f"longer than the maximum model length of {limit}. Make sure that `max_model_len` is no smaller than "
                "the number of text tokens (prompt + requested output tokens)."
            )

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: Any = True,
        lora_request: Any = None,
        priority: list[int] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Sample completions for each prompt; see the module docstring."""
        if lora_request is not None:
            raise NotImplementedError("lora_request: not implemented by hf_grpo's CPU stand-in for vLLM")
        items = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        if sampling_params is None:
            params = [SamplingParams()] * len(items)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(items)
        else:
            params = list(sampling_params)
            if len(params) != len(items):
                raise ValueError("The lengths of prompts and sampling_params must be the same.")
        if priority is not None and len(priority) != len(items):
            raise ValueError("The lengths of prompts and priority must be the same.")
        engine = self.llm_engine.engine
        self.llm_engine.check_ready()
        self.standin_stats["generate_calls"] += 1
        outputs = []
        for item, sp in zip(items, params, strict=True):
            text, ids = self._prompt_ids(item, tokenization_kwargs)
            self._validate_prompt(ids)
            spec = sp.to_engine_spec()
            completions = []
            for index, sample in enumerate(engine.sample(ids, spec)):
                logprobs = None
                if sp.logprobs is not None:
                    logprobs = [
                        {
                            token: Logprob(lp, rank, engine.decode_token(token) if sp.detokenize else None)
                            for token, lp, rank in position
                        }
                        for position in sample.top_logprobs
                    ]
                completions.append(
                    CompletionOutput(
                        index=index,
                        text=engine.decode(sample.token_ids, sp.skip_special_tokens) if sp.detokenize else "",
                        token_ids=list(sample.token_ids),
                        cumulative_logprob=math.fsum(sample.logprobs) if sp.logprobs is not None else None,
                        logprobs=logprobs,
                        finish_reason=sample.finish_reason,
                        stop_reason=sample.stop_reason,
                    )
                )
            self.standin_stats["requests"] += 1
            self.standin_stats["completions"] += len(completions)
            outputs.append(RequestOutput(str(next(self._request_ids)), text, ids, None, completions, finished=True))
        return outputs
