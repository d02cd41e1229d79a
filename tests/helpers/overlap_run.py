"""What the overlapped-generation tests (tests/test_overlap.py) share: a tiny trainer generating through the stand-in
vLLM server (in a thread) with ``generation.overlap`` on, and recorders of what the server, the generator and the
trainer did and when."""

from __future__ import annotations

import contextlib
import functools
import threading
import time

import requests
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from hf_grpo.generation.server_generator import ServerGenerator
from hf_grpo.training.trainer import GRPOTrainer

from .callbacks import StopAt
from .common import tiny_config, tiny_lora
from .fake_vllm_server import start_in_thread
from .reward_scripts import alternating


@functools.lru_cache(maxsize=1)
def train_dataset():
    from hf_grpo.data import DataArguments, load_grpo_datasets

    return load_grpo_datasets(DataArguments(arithmetic_train_size=128, arithmetic_eval_size=8))[0]


def three_of_four(prompts, completions, **kwargs) -> list[float]:
    """Rewards that vary in three groups of every four (of 4 completions): 3 of 4 groups kept per round, so dynamic
    sampling needs two rounds for 4 groups and carries the surplus."""
    return [float(i % 2) if (i // 4) % 4 != 3 else 0.0 for i in range(len(prompts))]


class StepTimes(TrainerCallback):
    """``ended[global_step]``: ``time.monotonic()`` when that optimizer step's training ended."""

    def __init__(self, trainer):
        self.ended: dict[int, float] = {}
        trainer.add_callback(self)

    def on_step_end(self, args, state, control, **kwargs):
        self.ended[state.global_step] = time.monotonic()


@contextlib.contextmanager
def make_overlap_trainer(
    policy_dir, out, reward=alternating, max_staleness: int = 1, stop_at: int | None = None, **overrides
):
    """``(trainer, server)``: an overlapped ``GRPOTrainer`` (seeded server requests, TRL's vLLM importance-sampling
    correction on) generating through a fresh stand-in server in a thread, stopped on exit."""
    server = start_in_thread(
        policy_dir, enable_lora=True, max_lora_rank=8, allow_runtime_lora_updating=True,
        logprobs_mode="processed_logprobs",
    )  # fmt: skip
    with server:
        generator = ServerGenerator(
            server.url, out / "adapters", request_timeout=30, server_timeout=30, seed=0,
            check_logprobs=False, max_staleness=max_staleness,
        )  # fmt: skip
        values = dict(
            per_device_train_batch_size=16, num_generations=4, max_completion_length=8, max_steps=4,
            vllm_importance_sampling_correction=True,
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(policy_dir),
            reward_funcs=reward,
            args=tiny_config(out, **{**values, **overrides}),
            train_dataset=train_dataset(),
            processing_class=AutoTokenizer.from_pretrained(policy_dir, padding_side="left"),
            peft_config=tiny_lora(),
            generator=generator,
        )
        if stop_at is not None:
            trainer.add_callback(StopAt(stop_at))
        yield trainer, server


def trainable(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def logged(trainer, key) -> list:
    return [r[key] for r in trainer.state.log_history if key in r]


def record_server_requests(server) -> list[dict]:
    """Every prompt the server received for generation: ``{"time", "model", "prompt"}`` (server side, on arrival)."""
    seen, handle = [], server.app.handle

    def recording(method, path, body, query=None):
        if path == "/v1/completions" and isinstance(body, dict):
            now = time.monotonic()
            seen.extend({"time": now, "model": body.get("model"), "prompt": p} for p in body["prompt"])
        return handle(method, path, body, query)

    server.app.handle = recording
    return seen


def record_taken(trainer, num_generations: int = 4) -> dict[int, list[list[int]]]:
    """``taken[global_step]``: the distinct prompts the trainer's generation cycle at that step trained on."""
    taken, generate = {}, trainer._ahead.generate

    def recording(step, prompt_ids, n):
        taken[step] = [list(p) for p in prompt_ids[::num_generations]]
        return generate(step, prompt_ids, n)

    trainer._ahead.generate = recording
    return taken


def record_generate_calls(trainer) -> list[dict]:
    """Every ``generator.generate`` call: ``{"thread", "adapter", "seed_key", "step", "prompt_ids"}`` (step: the
    optimizer step it was called at)."""
    calls, generate = [], trainer.generator.generate

    def recording(prompt_ids, n, step, adapter=None, seed_key=None):
        calls.append(
            {
                "thread": threading.current_thread().name,
                "adapter": adapter,
                "seed_key": seed_key,
                "step": step,
                "prompt_ids": prompt_ids,
            }
        )
        return generate(prompt_ids, n, step, adapter=adapter, seed_key=seed_key)

    trainer.generator.generate = recording
    return calls


def kill_while_in_flight(monkeypatch, generator_class, server, step: int) -> threading.Event:
    """When the round for ``step`` is sent ahead, hold its requests in the (subprocess) server and SIGKILL the server
    a second later, with them in flight. The event is set once the server is killed."""
    killed, generate = threading.Event(), generator_class.generate

    def kill():
        server.kill()
        killed.set()

    def generating(self, prompt_ids, n, step_now, adapter=None, seed_key=None):
        if adapter is not None and seed_key == (step, "overlap-0") and not killed.is_set():
            plan = {"seconds": 30, "path": "/v1/completions"}
            requests.post(f"{server.url}/fixture/delay", json=plan, timeout=10).raise_for_status()
            threading.Timer(1.0, kill).start()
        return generate(self, prompt_ids, n, step_now, adapter=adapter, seed_key=seed_key)

    monkeypatch.setattr(generator_class, "generate", generating)
    return killed
