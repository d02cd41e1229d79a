"""What ``--dry-run`` prints: the resolved values with where each came from, model, data, rewards, layout,
generation, batch arithmetic, the commands a run would start, the memory plan, the miniature's swaps and what this machine lacks."""

from __future__ import annotations

from ..data.loaders import TRL_COLUMNS
from ..generation.settings import training_cpus, training_gpus
from .memory import plan_lines
from .schema import NESTED, SECTIONS, Recipe, default_of, field_index


def _generation_lines(recipe: Recipe) -> list[str]:
    gen, chosen = recipe.generation, recipe.sources.get("generation.backend")  # backend: auto, and why it resolved
    lines = [f"generation.backend {chosen}"] if chosen else []
    if gen.backend is None:
        # from the recipe's values: a dry run checks the training config with vLLM switched off
        use_vllm = recipe.values.get("use_vllm", default_of("use_vllm"))
        mode = recipe.values.get("vllm_mode", default_of("vllm_mode"))
        engine = f"TRL vLLM ({mode})" if use_vllm else "transformers, in the training processes"
        if use_vllm and "vllm_mode" not in recipe.values:  # TRL 0.x recipes (open-r1's) meant a server
            engine += "; TRL 1.x's default mode (TRL 0.18 defaulted to server): set vllm_mode, or generation.backend"
        return [*lines, f"generation: {engine}"]
    if gen.backend != "vllm_server":
        return [*lines, f"generation: {gen.backend}"]
    devices = f"CPU cores {gen.cpus}" if gen.cpus is not None else f"GPUs {gen.server_gpus()}"
    where = f"started on {devices}" if gen.starts_server() else "already running"
    lines += [f"generation: vLLM server at {gen.url} ({where}), weight sync: {gen.sync_mode(recipe.model.use_peft)}"]
    if gen.starts_server() and gen.cpus is not None:
        lines.append(f"training CPU cores: {training_cpus(gen)} (the others)")
    elif gen.starts_server():
        lines.append(f"training GPUs: {training_gpus(gen, recipe.layout.num_processes)}")
    if gen.overlap:
        mode = recipe.values.get("vllm_importance_sampling_mode", default_of("vllm_importance_sampling_mode"))
        lines.append(
            f"overlap: on: the server generates step t+1 while step t trains; each batch comes from a policy at most "
            f"{gen.max_staleness} update(s) older (generation.max_staleness), reweighted by TRL's vLLM "
            f"importance-sampling correction ({mode})"
        )
    elif gen.sync_mode(recipe.model.use_peft) == "lora":
        lines.append("overlap: off: each step waits for its generation (generation.overlap: true overlaps them)")
    return lines


def _value_lines(recipe: Recipe) -> list[str]:
    """The explicit values by section, each with where it came from."""
    out = []
    by_section: dict[str, dict] = {}
    index = field_index()
    for key, value in recipe.values.items():
        by_section.setdefault(index[key][0] if key in index else key, {})[key] = value
    for section in [*SECTIONS, *NESTED]:
        if section in by_section:
            out.append(f"  {section}:")
            for key, value in sorted(by_section[section].items()):
                source = recipe.sources.get(key)
                out.append(f"    {key}: {value!r}" + (f"  # {source}" if source else ""))
    return out


def render_dry_run(recipe: Recipe, commands: list[str], per_node: list[str] = ()) -> str:
    """What ``--dry-run`` prints: resolved recipe, layout, batch arithmetic and the commands a run would start
    (``per_node``: with several machines, the command to start on each)."""
    spec, model = recipe.data.resolved(), recipe.model
    lora = f" + LoRA r={model.lora_r} alpha={model.lora_alpha} on {model.lora_target_modules}"
    out = [
        f"recipe: {recipe.path}",
        "",
        "resolved values, each with where it came from (every key not listed has its TRL / hf_grpo default):",
        *_value_lines(recipe),
        "",
        f"model: {model.model_name_or_path}" + (lora if model.use_peft else " (full fine-tuning)"),
        (
            f"data: {spec['name']} (task {spec['task']}, "
            f"problem column {spec['prompt_column'] or TRL_COLUMNS['prompt_column'] + ' (TRL default)'!r}, "
            f"gold column {spec['solution_column'] or TRL_COLUMNS['solution_column'] + ' (TRL default)'!r})"
        ),
        f"rewards: {recipe.rewards.reward_funcs} weights {recipe.training.reward_weights or 'all 1.0'}",
        "",
        f"layout: {recipe.layout.describe()}",
        *_generation_lines(recipe),
        "",
        f"batch arithmetic ({recipe.plan.num_processes} training processes):",
        recipe.plan.describe(),
        "",
        "commands:",
        *[f"  {c}" for c in commands],
    ]
    if per_node:
        out += ["", "on separate machines: this command on each, with its rank (or $NODE_RANK and $MASTER_ADDR set):"]
        out += [f"  {c}" for c in per_node]
    out += ["", *plan_lines(recipe)]
    out += recipe.miniature.describe()  # what --miniature swapped (nothing for the recipe as written)
    if recipe.hardware:
        out += ["", "this machine cannot run it as written (a real run exits with code 2):"]
        out += [f"  - {problem}" for problem in recipe.hardware]
    return "\n".join(out)
