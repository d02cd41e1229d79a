"""The rule of ``generation.overlap``'s cycle, one place for the recipe, ``GRPOTrainer`` and ``Lookahead``.

A generation serves ``steps_per_generation x num_iterations`` dataloader batches and an optimizer step takes
``gradient_accumulation_steps`` of them. Rounds are sent ahead at optimizer steps, so the first must be a multiple of
the second (every generation starts an optimizer step; the quotient, ``cycle_steps``, is the optimizer steps between
two generations), and ``generation.max_staleness`` must be ``cycle_steps`` or more (else no round can be sent ahead).
``overlap_cycle`` returns ``(cycle_steps, problems)``, ``problems`` empty or one message naming keys, values and the
fix; it raises nothing, each caller raises its own error.
"""

from __future__ import annotations


def overlap_cycle(
    max_staleness: int, steps_per_generation: int, num_iterations: int = 1, accumulation: int = 1
) -> tuple[int, list[str]]:
    """(optimizer steps between two generations, the rule's problems: none or one), for positive integers; the
    staleness bound is checked only against a whole cycle. ``accumulation`` is ``gradient_accumulation_steps``; a
    caller with the cycle already in optimizer steps passes it as ``steps_per_generation`` and leaves the rest at 1."""
    every = steps_per_generation * num_iterations
    cycle_steps = every // accumulation
    if every % accumulation:
        problem = (
            f"generation.overlap needs steps_per_generation x num_iterations ({every}) to be a multiple of "
            f"gradient_accumulation_steps ({accumulation}), so that every generation starts an optimizer step"
        )
    elif max_staleness < cycle_steps:
        problem = (
            f"generation.max_staleness {max_staleness} is below the {cycle_steps} optimizer steps one generation "
            "serves (steps_per_generation x num_iterations / gradient_accumulation_steps), so no round can be sent "
            f"ahead; set generation.max_staleness to {cycle_steps} or more"
        )
    else:
        return cycle_steps, []
    return cycle_steps, [problem]
