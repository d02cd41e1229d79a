"""The rule of generation.overlap's cycle (hf_grpo.generation.cycle): the optimizer steps one generation serves, and
what breaks the rule, named by key and value."""

from __future__ import annotations

import pytest

from hf_grpo.generation.cycle import overlap_cycle
from hf_grpo.recipe import RecipeError, load_recipe


def test_a_whole_cycle_within_the_bound_has_no_problem():
    # 4 steps_per_generation x 2 num_iterations = 8 batches, 2 per optimizer step: 4 optimizer steps per generation
    assert overlap_cycle(4, 4, 2, 2) == (4, [])
    assert overlap_cycle(9, 4, 2, 2) == (4, [])


def test_a_bound_below_the_cycle_names_the_staleness_and_the_cycle():
    cycle_steps, problems = overlap_cycle(3, 4, 2, 2)
    assert cycle_steps == 4
    (problem,) = problems
    assert problem.startswith("generation.max_staleness 3 is below the 4 optimizer steps")
    assert problem.endswith("set generation.max_staleness to 4 or more")


def test_a_generation_that_ends_mid_step_names_both_counts():
    cycle_steps, problems = overlap_cycle(100, 3, 1, 2)
    assert cycle_steps == 1
    (problem,) = problems  # the staleness bound is not checked against a cycle that is not whole
    assert "steps_per_generation x num_iterations (3)" in problem
    assert "gradient_accumulation_steps (2)" in problem


def test_a_cycle_already_in_optimizer_steps_is_checked_alone():
    """How Lookahead checks the cycle the trainer gives it: the other counts left at 1."""
    assert overlap_cycle(2, 2) == (2, [])
    assert "generation.max_staleness 1 is below the 2 optimizer steps" in overlap_cycle(1, 2)[1][0]


def test_the_recipe_refuses_with_the_rule_and_its_own_location():
    argv = ["recipes/qwen7b-lora-dedicated.yaml", "--generation.overlap", "true", "--num_iterations", "2"]
    with pytest.raises(RecipeError) as info:
        load_recipe(argv, for_run=False)
    where = "recipes/qwen7b-lora-dedicated.yaml (with --generation.overlap --num_iterations from the command line)"
    assert str(info.value) == f"{where}: {overlap_cycle(1, 32, 2, 32)[1][0]}"
