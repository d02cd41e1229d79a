"""Run under ``accelerate launch`` (2 CPU processes, gloo): dynamic sampling with a scripted reward, then every
process reports its digest of the global keep decisions and a checksum of its parameters; rank 0 writes them to
the JSON file given as the first argument.

    accelerate launch --config_file accelerate_configs/cpu.yaml -m tests.scripts.distributed_check out.json
"""

from __future__ import annotations

import hashlib
import json
import sys

from accelerate.utils import gather_object

from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.training.warm_start import warm_start
from tests.helpers.reward_scripts import half_varying
from tests.helpers.trainers import make_trainer
from tests.scripts.check_main import run_check


def main(out: str) -> None:
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64)
    warm_start(model, tokenizer, steps=40)
    train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=256, arithmetic_eval_size=8))
    trainer = make_trainer(
        "/tmp/hf_grpo_distributed_check",
        model=model,
        tokenizer=tokenizer,
        reward_funcs=half_varying,
        train_dataset=train,
        per_device_train_batch_size=8,
        max_completion_length=10,
        max_steps=4,
        dynamic_sampling=True,
        max_generation_batches=6,
    )
    trainer.train()
    params = hashlib.sha256()
    for name, p in sorted(trainer.model.named_parameters()):
        if p.requires_grad:
            params.update(name.encode() + p.detach().cpu().double().numpy().tobytes())
    report = {
        "rank": trainer.accelerator.process_index,
        "world_size": trainer.accelerator.num_processes,
        "keep_digest": trainer._sampler.keep_digest.hexdigest(),
        "params": params.hexdigest(),
        "rounds": [r["dynamic_sampling/rounds"] for r in trainer.state.log_history if "dynamic_sampling/rounds" in r],
    }
    reports = gather_object([report])
    if trainer.accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump(reports, f)


if __name__ == "__main__":
    run_check(main, sys.argv[1])
