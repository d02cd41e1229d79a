"""Run under ``accelerate launch`` (2 CPU processes, gloo): ``keep_top_k: 1`` with a slow rank 1.

Every step saves a checkpoint and is scored with a falling held-out accuracy, so each new checkpoint ranks last and
rank 0 deletes it right after saving. Rank 1 writes its RNG state 2 s late. Rank 0 must not delete the checkpoint
before rank 1 has finished writing into it, or rank 1 re-creates ``checkpoint-N`` holding only its own files.
The test then lists the checkpoints left in ``output_dir``.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m tests.scripts.keep_top_k_check OUTPUT_DIR
"""

from __future__ import annotations

import sys
import time

from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.training.trainer import GRPOTrainer
from hf_grpo.training.warm_start import warm_start
from tests.helpers.common import tiny_config, tiny_lora
from tests.helpers.reward_scripts import alternating
from tests.scripts.check_main import run_check


class SlowRankOne(GRPOTrainer):
    def _save_checkpoint(self, model, trial):
        step = self.state.global_step
        self.last_task_eval = (step, 1.0 / step)  # what the task evaluator records; falls with every step
        super()._save_checkpoint(model, trial)

    def _save_rng_state(self, output_dir):
        if self.accelerator.process_index == 1:
            time.sleep(2.0)
        super()._save_rng_state(output_dir)


def main(out: str) -> None:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64)
    warm_start(model, tokenizer, steps=10)
    train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=64, arithmetic_eval_size=8))
    args = tiny_config(
        out,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=3,
        save_strategy="steps",
        save_steps=1,
        task_eval_steps=1,
        keep_top_k=1,
    )
    trainer = SlowRankOne(
        model=model,
        reward_funcs=alternating,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=tiny_lora(),
    )
    trainer.train()


if __name__ == "__main__":
    run_check(main, sys.argv[1])
