"""Dynamic sampling vs stock TRL on the embedded arithmetic task, same model, seed, data, hyperparameters and budget.

    python benchmarks/dynamic_sampling.py                      # about 10 minutes on 2 CPU cores
    python benchmarks/dynamic_sampling.py --budget 60 --target 0.5

Three arms train the same warm-started tiny model (built once, copied into each arm):

- ``stock``: ``trl.GRPOTrainer`` with ``trl.GRPOConfig``;
- ``ours+ds``: ``hf_grpo.GRPOTrainer`` with ``dynamic_sampling: true``;
- ``ours``: ``hf_grpo.GRPOTrainer`` with dynamic sampling off.

Each arm trains until its training wall-clock time reaches ``--budget`` seconds; every ``--eval-every`` optimizer
steps the clock is paused and greedy accuracy on the held-out split is measured. A 200-problem evaluation moves by
a few points from one measurement to the next, so accuracy is smoothed over the last ``--smooth`` evaluations, and
the target is the warm-started model's accuracy plus ``--target-gain``. Reported per seed: best and final smoothed
held-out accuracy, training seconds until the smoothed accuracy first reaches the target, and the mean seconds
per optimizer step (after ``--warmup`` steps). The overhead comparison (``ours`` vs ``stock``) runs the two arms alternately
``--overhead-repeats`` times for ``--overhead-steps`` steps each, from the same start: with the same seed they make
the same completions and updates, so the difference in step time is hf_grpo's per-step overhead.
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import platform
import statistics
import time

import torch
from peft import LoraConfig
from transformers import TrainerCallback

from hf_grpo.config import HfGRPOConfig
from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.evaluation.core import evaluate
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.rewards.functions import gsm8k_correctness
from hf_grpo.training.trainer import GRPOTrainer
from hf_grpo.training.warm_start import warm_start


class Clock(TrainerCallback):
    """Training wall-clock time with evaluation paused; stops at the budget; records held-out accuracy."""

    def __init__(self, budget: float, eval_every: int, evaluate_fn, max_steps: int | None = None):
        self.budget, self.eval_every, self.evaluate_fn, self.max_steps = budget, eval_every, evaluate_fn, max_steps
        self.train_seconds, self.started = 0.0, None
        self.step_seconds: list[float] = []
        self.curve: list[tuple[int, float, float]] = []  # (step, training seconds, held-out accuracy)

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        elapsed = time.perf_counter() - self.started
        self.train_seconds += elapsed
        self.step_seconds.append(elapsed)
        if self.eval_every and state.global_step % self.eval_every == 0:
            self.curve.append((state.global_step, self.train_seconds, self.evaluate_fn(model)))
        if self.train_seconds >= self.budget or (self.max_steps and state.global_step >= self.max_steps):
            control.should_training_stop = True


def make_trainer(arm: str, model, tokenizer, train, out: str, lr: float, batch: int, generations: int, seed: int = 0):
    common = dict(
        output_dir=out,
        per_device_train_batch_size=batch,
        num_generations=generations,
        max_completion_length=16,
        learning_rate=lr,
        lr_scheduler_type="constant",
        max_steps=100_000,
        logging_steps=10_000,
        report_to=[],
        save_strategy="no",
        seed=seed,
        gradient_checkpointing=False,
        disable_tqdm=True,
        bf16=False,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        temperature=1.0,
    )
    peft = LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    model = copy.deepcopy(model)
    if arm == "stock":
        import trl

        return trl.GRPOTrainer(
            model=model,
            reward_funcs=gsm8k_correctness,
            args=trl.GRPOConfig(**common),
            train_dataset=train,
            processing_class=tokenizer,
            peft_config=peft,
        )
    config = HfGRPOConfig(**common, dynamic_sampling=arm == "ours+ds", max_generation_batches=10)
    return GRPOTrainer(
        model=model,
        reward_funcs=gsm8k_correctness,
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=peft,
    )


def main() -> None:
    args = parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=128)
    warm_start(model, tokenizer, args.warm_start_steps, lr=2e-3)
    train, held_out = load_grpo_datasets(DataArguments(arithmetic_train_size=4000, arithmetic_eval_size=200))
    accuracy = functools.partial(held_out_accuracy, tokenizer, held_out)

    start_accuracy = accuracy(model)
    target = start_accuracy + args.target_gain
    print_setup(args, len(held_out), start_accuracy, target)
    rows = race_to_target(args, model, tokenizer, train, accuracy, start_accuracy, target)
    print_race(args, rows, target)
    measure_overhead(args, model, tokenizer, train, accuracy)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0, help="training seconds per arm")
    parser.add_argument("--target-gain", type=float, default=0.25, help="target = start accuracy + this")
    parser.add_argument("--smooth", type=int, default=3, help="evaluations averaged for the smoothed accuracy")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="training seeds (same initial model)")
    parser.add_argument("--warm-start-steps", type=int, default=300, help="as recipes/tiny.yaml")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch", type=int, default=128, help="completions per step")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the step-time mean")
    parser.add_argument("--overhead-steps", type=int, default=30)
    parser.add_argument("--overhead-repeats", type=int, default=3)
    parser.add_argument("--out", default="/tmp/hf_grpo_bench_ds")
    return parser.parse_args()


def held_out_accuracy(tokenizer, held_out, model) -> float:
    return evaluate(model, tokenizer, held_out, "gsm8k", max_new_tokens=16).accuracy


def print_setup(args: argparse.Namespace, n_held_out: int, start_accuracy: float, target: float) -> None:
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}; held-out: {n_held_out} problems, greedy; warm start {args.warm_start_steps} steps "
        f"-> held-out accuracy {start_accuracy:.3f}"
    )
    print(
        f"each arm: {args.batch} completions/step ({args.batch // args.generations} prompts x {args.generations}), "
        f"lr {args.lr}, LoRA r16, training budget {args.budget:.0f} s (evaluation time excluded), eval every "
        f"{args.eval_every} steps\n"
    )
    print(
        f"target: smoothed held-out accuracy >= {target:.3f} (start {start_accuracy:.3f} + {args.target_gain}); "
        f"smoothing: mean of the last {args.smooth} evaluations\n"
    )


def smoothed(curve: list[tuple[int, float, float]], window: int) -> list[float]:
    """Each evaluation's accuracy averaged with up to ``window - 1`` evaluations before it."""
    accs = [acc for *_, acc in curve]
    return [
        sum(accs[max(0, i - window + 1) : i + 1]) / len(accs[max(0, i - window + 1) : i + 1]) for i in range(len(accs))
    ]


def race_to_target(
    args: argparse.Namespace, model, tokenizer, train, accuracy, start_accuracy: float, target: float
) -> list[dict]:
    """``stock`` and ``ours+ds`` per seed for the training budget; one row per run, and its curve printed."""
    rows = []
    for seed in args.seeds:
        for arm in ("stock", "ours+ds"):
            trainer = make_trainer(
                arm, model, tokenizer, train, f"{args.out}/{arm}-{seed}", args.lr, args.batch, args.generations, seed
            )
            clock = Clock(args.budget, args.eval_every, accuracy)
            trainer.add_callback(clock)
            trainer.train()
            smooth = smoothed(clock.curve, args.smooth)
            reached = next((clock.curve[i][1] for i, acc in enumerate(smooth) if acc >= target), None)
            zero_std = [r["frac_reward_zero_std"] for r in trainer.state.log_history if "frac_reward_zero_std" in r]
            rows.append(
                dict(
                    seed=seed,
                    arm=arm,
                    steps=trainer.state.global_step,
                    step_time=statistics.mean(clock.step_seconds[args.warmup :]),
                    zero_std=statistics.mean(zero_std) if zero_std else float("nan"),
                    best=max(smooth) if smooth else start_accuracy,
                    final=smooth[-1] if smooth else start_accuracy,
                    time_to_target=reached,
                )
            )
            print(
                f"seed {seed} {arm:8s} (step, train s, acc): "
                + ", ".join(f"({s}, {t:.0f}, {a:.2f})" for s, t, a in clock.curve),
                flush=True,
            )
    return rows


def print_race(args: argparse.Namespace, rows: list[dict], target: float) -> None:
    """The runs' table, then per seed which arm reached the target first."""
    print(
        f"\n{'seed':>4s} {'arm':8s} {'steps':>6s} {'s/step':>7s} {'zero-std':>9s} {'best':>6s} {'final':>6s} "
        f"{'time to ' + format(target, '.2f'):>14s}   (accuracies smoothed)"
    )
    for r in rows:
        ttt = f"{r['time_to_target']:.0f} s" if r["time_to_target"] is not None else "not reached"
        print(
            f"{r['seed']:4d} {r['arm']:8s} {r['steps']:6d} {r['step_time']:7.3f} {r['zero_std']:9.2f} "
            f"{r['best']:6.3f} {r['final']:6.3f} {ttt:>14s}"
        )
    for seed in args.seeds:
        stock_t, ds_t = (
            next(r["time_to_target"] for r in rows if r["seed"] == seed and r["arm"] == arm)
            for arm in ("stock", "ours+ds")
        )
        print(f"seed {seed}: time to target: {verdict(stock_t, ds_t, args.budget)}")


def verdict(stock_t: float | None, ds_t: float | None, budget: float) -> str:
    if stock_t is not None and ds_t is not None:
        return f"stock / ours+ds = {stock_t / ds_t:.2f}x"
    if ds_t is not None:
        return f"ours+ds reached it in {ds_t:.0f} s; stock did not within {budget:.0f} s"
    if stock_t is not None:
        return f"stock reached it in {stock_t:.0f} s; ours+ds did not"
    return "neither reached it"


def measure_overhead(args: argparse.Namespace, model, tokenizer, train, accuracy) -> None:
    """Per-step overhead with dynamic sampling off: alternate arms, identical work (same seed, same trajectory)."""
    times: dict[str, list[float]] = {"stock": [], "ours": []}
    for _ in range(args.overhead_repeats):
        for arm in ("stock", "ours"):
            trainer = make_trainer(
                arm, model, tokenizer, train, f"{args.out}/{arm}-overhead", args.lr, args.batch, args.generations
            )
            clock = Clock(float("inf"), 0, accuracy, max_steps=args.overhead_steps)
            trainer.add_callback(clock)
            trainer.train()
            times[arm].append(statistics.mean(clock.step_seconds[args.warmup :]))
    stock_med, ours_med = statistics.median(times["stock"]), statistics.median(times["ours"])
    print(
        f"\nper-step time, dynamic sampling off, {args.overhead_repeats} alternating runs x "
        f"{args.overhead_steps} steps (median of run means):"
    )
    print(f"  stock {stock_med:.4f} s  runs {[round(t, 4) for t in times['stock']]}")
    print(f"  ours  {ours_med:.4f} s  runs {[round(t, 4) for t in times['ours']]}")
    print(f"  ours / stock = {ours_med / stock_med:.3f} ({(ours_med / stock_med - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
