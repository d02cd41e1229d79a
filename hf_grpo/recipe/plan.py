"""The batch arithmetic of a recipe: how its batch sizes form whole prompt groups for a number of processes."""

from __future__ import annotations

import math

from .schema import BatchPlan, RecipeError, default_of


def batch_plan(values: dict, num_processes: int) -> BatchPlan:
    """Batch arithmetic for ``num_processes``; RecipeError when it cannot form whole prompt groups."""

    def get(key):
        return values.get(key, default_of(key))

    pdb, ga, g = get("per_device_train_batch_size"), get("gradient_accumulation_steps"), get("num_generations")
    spg, gbs = get("steps_per_generation"), get("generation_batch_size")
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations"):
        if get(key) is None or get(key) < 1:
            raise RecipeError(f"{key} must be a positive integer, got {get(key)!r}")
    if g < 2:
        raise RecipeError(f"num_generations must be at least 2 (GRPO compares completions), got {g}")
    global_batch = pdb * num_processes
    if spg is not None and gbs is not None:
        raise RecipeError(f"set generation_batch_size or steps_per_generation, not both (got {gbs} and {spg})")
    if gbs is not None:
        if gbs % global_batch:
            raise RecipeError(
                f"generation_batch_size {gbs} is not divisible by per_device_train_batch_size {pdb} x "
                f"{num_processes} processes = {global_batch}; use a multiple of {global_batch}"
            )
        spg = gbs // global_batch
    spg = spg or ga
    plan = BatchPlan(num_processes, pdb, ga, spg, g)
    if plan.completions_per_generation % g:
        multiple = g // math.gcd(g, num_processes)
        raise RecipeError(
            f"completions per generation ({pdb} per device x {spg} steps_per_generation x {num_processes} "
            f"processes = {plan.completions_per_generation}) is not divisible by num_generations {g}; make "
            f"per_device_train_batch_size x steps_per_generation a multiple of {multiple}, or change num_generations"
        )
    if get("dynamic_sampling") and (pdb * spg) % g:
        raise RecipeError(
            "dynamic_sampling keeps or drops whole prompt groups on each process, so per_device_train_batch_size x "
            f"steps_per_generation ({pdb} x {spg} = {pdb * spg}) must be a multiple of num_generations {g}"
        )
    g_eval, pde = get("num_generations_eval") or g, get("per_device_eval_batch_size")
    if get("eval_strategy") not in ("no", None) and (pde * num_processes) % g_eval:
        raise RecipeError(
            f"eval batch per_device_eval_batch_size {pde} x {num_processes} processes is not "
            f"divisible by num_generations_eval {g_eval}; set per_device_eval_batch_size to a multiple of {g_eval}"
        )
    return plan


def check_rows(plan: BatchPlan, rows: int, data: str) -> None:
    """RecipeError unless ``rows`` training rows fill one generation: TRL's sampler draws ``prompts_per_generation``
    distinct prompts and drops a partial batch, so with fewer the run makes 0 optimizer steps and saves an untrained
    model. ``data`` says which rows were counted (``the training data has at most 10 rows (max_train_samples)``)."""
    if rows >= plan.prompts_per_generation:
        return
    raise RecipeError(
        f"one generation needs {plan.prompts_per_generation} prompts (per_device_train_batch_size "
        f"{plan.per_device_train_batch_size} x steps_per_generation {plan.steps_per_generation} x "
        f"{plan.num_processes} processes / num_generations {plan.num_generations}) but {data}, so the run would make "
        "0 optimizer steps; lower per_device_train_batch_size (or steps_per_generation), or use more data"
    )
