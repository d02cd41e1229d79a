"""Run under ``accelerate launch`` (2 CPU processes, gloo) or plain ``python``: prompt selection with a scripted
reward, once straight through and once stopped after a checkpoint and resumed from it; each process reports both
runs' parameter checksums, reward-history state and keep digests, and rank 0 writes them to the JSON file given.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m tests.scripts.selection_resume_check out.json DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from accelerate.utils import gather_object

from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.training.trainer import GRPOTrainer
from hf_grpo.training.warm_start import warm_start
from tests.helpers.callbacks import StopAt
from tests.helpers.reward_scripts import half_varying
from tests.helpers.trainers import make_trainer
from tests.scripts.check_main import run_check


STEPS, STOP = 6, 3


def build(model, tokenizer, train, out: Path, world: int) -> GRPOTrainer:
    return make_trainer(
        out,
        model=model,
        tokenizer=tokenizer,
        reward_funcs=half_varying,
        train_dataset=train,
        per_device_train_batch_size=8 // world,  # the same 2 prompts a step on 1 process or 2
        num_generations=4,
        max_completion_length=8,
        max_steps=STEPS,
        dynamic_sampling=True,
        max_generation_batches=6,
        prompt_selection=True,
        save_strategy="steps",
        save_steps=1,
    )


def checksum(trainer) -> str:
    params = hashlib.sha256()
    for name, p in sorted(trainer.model.named_parameters()):
        if p.requires_grad:
            params.update(name.encode() + p.detach().cpu().double().numpy().tobytes())
    return params.hexdigest()


def report(trainer) -> dict:
    skipped = [r["selection/skipped"] for r in trainer.state.log_history if "selection/skipped" in r]
    return {
        "params": checksum(trainer),
        "history": json.dumps(trainer._sampler.selector.history.state_dict(), sort_keys=True),
        "stream": trainer._sampler.stream.state(),
        "skipped": skipped,
    }


def main(out: str, folder: str, world: int) -> None:
    tokenizer = build_tokenizer()
    base = build_model(tokenizer, hidden_size=64)
    warm_start(base, tokenizer, steps=20)
    train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=24, arithmetic_eval_size=8))
    state = {k: v.clone() for k, v in base.state_dict().items()}

    def fresh_model():
        model = build_model(tokenizer, hidden_size=64)
        model.load_state_dict(state)
        return model

    straight = build(fresh_model(), tokenizer, train, Path(folder) / "straight", world)
    straight.train()
    first = build(fresh_model(), tokenizer, train, Path(folder) / "resumed", world)
    first.add_callback(StopAt(STOP))
    first.train()
    second = build(fresh_model(), tokenizer, train, Path(folder) / "resumed", world)
    second.train(resume_from_checkpoint=str(Path(folder) / "resumed" / f"checkpoint-{STOP}"))
    mine = {
        "rank": straight.accelerator.process_index,
        "straight": report(straight),
        "stopped": report(first),
        "resumed": report(second),
    }
    reports = gather_object([mine])
    if straight.accelerator.is_main_process:
        Path(out).write_text(json.dumps(reports))


if __name__ == "__main__":
    run_check(main, sys.argv[1], sys.argv[2], int(os.environ.get("WORLD_SIZE", "1")))
