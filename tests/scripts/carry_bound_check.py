"""Run under ``accelerate launch`` (2 CPU processes, gloo): dynamic sampling where rank 1's rewards are always equal
(it never keeps a group, so every step runs all rounds) and rank 0's always vary (it keeps every group, and has a
surplus each step). Each process records its carried pool after every step and, for every group it trains on, how
many steps ago it was generated; rank 0 writes both processes' records to the JSON file given as the first argument.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m tests.scripts.carry_bound_check out.json
"""

from __future__ import annotations

import json
import os
import sys

from accelerate.utils import gather_object
from transformers import TrainerCallback

from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.training.trainer import GRPOTrainer
from tests.helpers.trainers import make_trainer
from tests.scripts.check_main import run_check


def varying_on_rank_zero(prompts, completions, **kwargs) -> list[float]:
    """0, 1, 0, 1, ... in every group on rank 0; all zeros on the other ranks."""
    varying = int(os.environ.get("RANK", "0")) == 0
    return [float(i % 2) if varying else 0.0 for i in range(len(prompts))]


class PoolRecorder(TrainerCallback):
    """The carried pool's size after each step, and the age (in steps) of each group taken for training."""

    def __init__(self, trainer: GRPOTrainer):
        self.trainer, self.pool_sizes, self.ages, self.born = trainer, [], [], {}
        pool = trainer._sampler.pool
        add, take = pool.add, pool.take

        def add_stamped(groups):
            self.born.update({id(g): trainer.state.global_step for g in groups})
            add(groups)

        def take_aged(n):
            taken = take(n)
            self.ages += [trainer.state.global_step - self.born.pop(id(g)) for g in taken]
            return taken

        pool.add, pool.take = add_stamped, take_aged

    def on_step_end(self, args, state, control, **kwargs):
        self.pool_sizes.append(len(self.trainer._sampler.pool))


def main(out: str) -> None:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64)
    train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=256, arithmetic_eval_size=8))
    trainer = make_trainer(
        "/tmp/hf_grpo_carry_bound_check",
        model=model,
        tokenizer=tokenizer,
        reward_funcs=varying_on_rank_zero,
        train_dataset=train,
        per_device_train_batch_size=8,  # 2 groups of 4 per process
        max_completion_length=6,
        max_steps=4,
        dynamic_sampling=True,
        max_generation_batches=3,
    )
    recorder = PoolRecorder(trainer)
    trainer.add_callback(recorder)
    trainer.train()
    report = {"rank": trainer.accelerator.process_index, "pool_sizes": recorder.pool_sizes, "ages": recorder.ages}
    reports = gather_object([report])
    if trainer.accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump(reports, f)


if __name__ == "__main__":
    run_check(main, sys.argv[1])
