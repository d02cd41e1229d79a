"""A recipe's memory plan (``hf_grpo.launch.memory_plan``) from its values: the model's shape from its config.json
on this machine, else from the published configs of the shipped recipes' models; the device's memory from
``gpu_memory_gb``, else this machine's GPU or RAM. ``check_memory`` refuses a run whose plan does not fit, in one
line naming the largest term and the change that fits, before any model loads (``memory_check: warn`` runs anyway).
"""

from __future__ import annotations

import os
from pathlib import Path

from transformers import LlamaConfig, Qwen2Config

from ..base.peak_memory import peak_memory
from ..data.loaders import PRESETS
from ..launch import memory_plan as mp
from ..launch.hardware import this_machine
from ..models.tiny import tiny_config
from .checks_env import local_config
from .schema import Recipe, RecipeError


# Facts from the published config.json of the shipped recipes' models, for a plan on a machine that has not
# downloaded them (no weights are needed for a plan).
PUBLISHED = {
    "Qwen/Qwen2.5-7B-Instruct": (Qwen2Config, dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, dtype="bfloat16")),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": (Qwen2Config, dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=False, dtype="bfloat16")),
    "Qwen/Qwen2.5-Math-1.5B": (Qwen2Config, dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, dtype="bfloat16")),
    "HuggingFaceTB/SmolLM2-135M-Instruct": (LlamaConfig, dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, dtype="bfloat16")),
}  # fmt: skip
PUBLISHED["smollm2-135m-instruct-q4_1"] = PUBLISHED["HuggingFaceTB/SmolLM2-135M-Instruct"]  # hf-grpo model get's
TINY_VOCAB = 361  # the embedded tiny tokenizer's length (hf_grpo.models.tiny.build_tokenizer)


def model_shape(recipe: Recipe) -> mp.ModelShape | None:
    """The policy's shape without its weights; None when neither its config nor a published one is here."""
    model = recipe.model
    name = recipe.values.get("model_name_or_path", model.model_name_or_path)
    if name == "tiny":
        return mp.shape_from_config(tiny_config(TINY_VOCAB, model.tiny_hidden_size), name, "the embedded tiny model")
    config = local_config(model, bool(recipe.values.get("trust_remote_code")))
    if config is not None:
        return mp.shape_from_config(config, name, "its config.json on this machine")
    if name in PUBLISHED:
        cls, facts = PUBLISHED[name]
        return mp.shape_from_config(cls(**facts), name, "its published config")
    return None


def _on_gpu(recipe: Recipe, for_run: bool) -> bool:
    """Whether the plan is for GPUs: a run trains on this machine's, a dry run plans for the GPUs a recipe names
    (``gpu_memory_gb``, bf16 or fp16) where this machine has none."""
    if recipe.miniature.active:
        return False
    if this_machine().cuda_devices:
        return True
    return not for_run and any(recipe.values.get(k) for k in ("gpu_memory_gb", "bf16", "fp16"))


def _generation(recipe: Recipe) -> tuple[str, float | None]:
    """(``hf``, ``vllm_colocate`` or ``vllm_server``; vLLM's share of a GPU: the recipe's, else TRL's and vLLM's
    defaults)."""
    gen, values = recipe.generation, recipe.values
    backend = gen.backend
    if backend is None and values.get("use_vllm"):
        backend = "vllm_colocate" if values.get("vllm_mode", "colocate") == "colocate" else "vllm_server"
    if backend == "vllm_colocate":
        return backend, gen.gpu_memory_utilization or values.get("vllm_gpu_memory_utilization") or 0.3
    if backend == "vllm_server":
        return backend, gen.gpu_memory_utilization or 0.9
    return "hf", None


def settings(recipe: Recipe, shape: mp.ModelShape, for_run: bool = False) -> tuple[mp.Settings, list[str]]:
    """The plan's inputs from the recipe, and what it had to assume."""
    values, model, args, plan, layout = recipe.values, recipe.model, recipe.training, recipe.plan, recipe.layout
    data = recipe.data
    assumed = []

    def prompt_tokens(name: str) -> int:
        if model.model_name_or_path == "tiny":
            return mp.TINY_PROMPT_TOKENS
        if name in mp.PROMPT_TOKENS:
            return mp.PROMPT_TOKENS[name]
        assumed.append(f"prompts of {mp.DEFAULT_PROMPT_TOKENS} tokens at most in a batch ({name} is not a dataset "
                       "the plan knows)")  # fmt: skip
        return mp.DEFAULT_PROMPT_TOKENS

    prompt = prompt_tokens(data.dataset_name)
    eval_prompt = prompt_tokens(data.eval_dataset_name) if data.eval_dataset_name else prompt
    generation, share = _generation(recipe)
    completion = values.get("max_completion_length") or 256
    dtype = model.dtype if model.dtype not in (None, "auto") else shape.dtype
    deepspeed = layout.distributed_type == "DEEPSPEED"
    on_gpu = _on_gpu(recipe, for_run)
    env_cache = recipe.env.get("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4"))
    s = mp.Settings(
        dtype=dtype,
        mixed_precision=bool(values.get("bf16") or values.get("fp16")) and on_gpu,
        use_peft=model.use_peft,
        lora_r=model.lora_r,
        lora_targets=model.lora_target_modules,
        lora_dropout=model.lora_dropout,
        load_in_4bit=bool(getattr(model, "load_in_4bit", False)),
        processes=layout.num_processes,
        zero_stage=layout.zero_stage if deepspeed else None,
        fsdp=layout.distributed_type == "FSDP",
        offload_optimizer=deepspeed and layout.offload_optimizer in ("cpu", "nvme"),
        beta=args.beta,
        per_device_batch=plan.per_device_train_batch_size,
        generation_batch=plan.per_device_train_batch_size * plan.steps_per_generation,
        eval_batch=_eval_rows(recipe) if args.eval_before_after or args.task_eval_steps else 0,
        prompt_tokens=prompt,
        eval_prompt_tokens=eval_prompt,
        completion_tokens=completion,
        eval_completion_tokens=args.eval_max_new_tokens or completion,
        activation_checkpointing=bool(args.activation_checkpointing or args.gradient_checkpointing),
        warm_start_batch=model.warm_start_batch_size if model.warm_start_steps else 0,
        generation=generation,
        vllm_utilization=share,
        vllm_tensor_parallel=recipe.generation.tensor_parallel_size,
        prompts_per_generation=plan.prompts_per_generation,
        num_generations=plan.num_generations,
        on_gpu=on_gpu,
        vllm_cpu_cache_gb=float(env_cache) if env_cache.replace(".", "", 1).isdigit() else 4.0,
        shared_prompts=args.shared_prompts and layout.zero_stage != 3 and layout.distributed_type != "FSDP",
    )
    return s, assumed


def _eval_rows(recipe: Recipe) -> int:
    """Held-out rows generated at once: ``per_device_eval_batch_size``, or the whole held-out set when smaller."""
    data, batch = recipe.data, recipe.training.per_device_eval_batch_size
    sizes = [data.max_eval_samples, data.arithmetic_eval_size if data.dataset_name in PRESETS else None]
    return min([batch, *(n for n in sizes if n)])


def _gpu_memory(recipe: Recipe) -> tuple[int, str] | None:
    given = recipe.values.get("gpu_memory_gb")
    if given:
        return int(given * mp.GiB), "gpu_memory_gb"
    if this_machine().cuda_devices:
        import torch

        props = torch.cuda.get_device_properties(0)
        return props.total_memory, f"{props.name}, this machine's"
    return None


def _host_memory(on_gpu: bool) -> tuple[int, str] | None:
    """This machine's RAM (``MemTotal``: what other processes hold changes from one moment to the next), when the plan
    is for this machine (training on its CPU, or on its GPU)."""
    if on_gpu and not this_machine().cuda_devices:
        return None
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        return None
    fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
    total = fields.get("MemTotal", "0 kB").split()[0]
    return (int(total) * 1024, "this machine's RAM") if total.isdigit() and int(total) else None


def memory_plan(recipe: Recipe, for_run: bool = False) -> tuple[mp.MemoryPlan | None, tuple | None]:
    """(the plan, the first single change that makes it fit when it does not); (None, None) without a shape.
    ``for_run``: the plan of a run on this machine, else of a dry run (``_on_gpu``)."""
    shape = model_shape(recipe)
    if shape is None:
        return None, None
    s, assumed = settings(recipe, shape, for_run)
    gpu, host = _gpu_memory(recipe), _host_memory(s.on_gpu)
    plan = mp.make_plan(shape, s, gpu, host, assumed)
    return plan, mp.find_fix(plan, gpu, host)


def plan_lines(recipe: Recipe, for_run: bool = False) -> list[str]:
    """What ``--dry-run`` and (``for_run``) the start of a run print."""
    plan, fix = memory_plan(recipe, for_run)
    if plan is None:
        name = recipe.model.model_name_or_path
        return [f"memory plan: none: the config of {name} is not on this machine (it loads with the model)"]
    lines = plan.lines()
    if fix is not None:
        key, value, changed = fix
        lines.append(f"  fix: {key}: {_yaml(value)} ({changed.verdict()})")
    elif plan.unfit is not None:
        lines.append(f"  fix: no single change fits; the largest term is {plan.unfit.largest().text()}")
    return lines


def check_memory(recipe: Recipe) -> None:
    """RecipeError (exit 2, before any model loads) when the plan does not fit and ``memory_check`` is ``refuse``."""
    plan, fix = memory_plan(recipe, for_run=True)
    if plan is None or plan.unfit is None or recipe.launch.memory_check != "refuse":
        return
    device = plan.unfit
    largest = device.largest()
    if fix is not None:
        key, value, changed = fix
        how = f"set {key}: {_yaml(value)} ({changed.verdict()})"
    else:
        how = "no single change fits: lower the batch sizes, shard with accelerate_config: zero3, or train LoRA"
    raise RecipeError(
        f"memory plan: does not fit: {device.label} needs {mp.gb(device.peak)} of {mp.gb(device.capacity)} "
        f"({device.capacity_source}); the largest term is {largest.text()}; {how}; or memory_check: warn to run "
        "anyway (--dry-run prints the plan)"
    )


def _yaml(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def measured_line(recipe: Recipe) -> str | None:
    """The end of a run: its measured peak beside the plan's (on a GPU without the CUDA context, which PyTorch's
    allocator does not count, and without vLLM's share)."""
    plan, _ = memory_plan(recipe, for_run=True)
    measured = peak_memory()
    if plan is None or measured is None:
        return None
    device = plan.devices[0]
    outside = sum(t.nbytes for t in device.static if t.name.startswith(("CUDA context", "vLLM's share")))
    planned = device.peak // device.copies - outside
    nbytes, what = measured
    return f"memory: peak {mp.gb(nbytes)} ({what}); the plan's {device.label}: {mp.gb(planned)}"
