"""Does the memory plan hold on this CPU? The plan's peak (``hf_grpo.launch.memory_plan``, as ``--dry-run`` prints
it) against the peak resident memory of the same recipe's run, and some terms measured on their own.

    hf-grpo model get smollm2-135m-instruct-q4_1         # once
    python benchmarks/memory_plan_check.py                 # tiny, smollm2-135m-arith, smollm2-135m-reasoning
    python benchmarks/memory_plan_check.py --terms-only    # only the terms measured alone (about a minute)

Runs: each recipe as ``python -m hf_grpo.train RECIPE`` with every phase at the recipe's own shapes (training
micro-batch, generation batch, one evaluation batch of ``per_device_eval_batch_size`` problems, the warm start's
batch) but few of them: 2 GRPO steps, 2 warm-start steps, no periodic evaluation. The measured peak is the largest
``VmHWM`` (peak resident set) of the run's processes, read from /proc every 0.2 s; the planned one is the plan's RAM
peak for the recipe as written.

Terms, on SmolLM2 in this process: the weights (resident once every page is touched); one GRPO micro-batch of the
arithmetic recipe's shape through hf_grpo's shared forward and TRL's fused LM head, forward and backward: the bytes autograd saves (counted with
``torch.autograd.graph.saved_tensors_hooks``, the plan's ``saved_per_token``) and the resident peak above the state
before (sampled every 2 ms, after ``malloc_trim``), whose ratio is the plan's CPU_ALLOCATOR_FACTOR.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hf_grpo.launch import memory_plan as mp  # noqa: E402
from hf_grpo.models import registry  # noqa: E402
from hf_grpo.recipe import load_recipe  # noqa: E402
from hf_grpo.recipe.memory import memory_plan  # noqa: E402


MODEL = "smollm2-135m-instruct-q4_1"
RECIPES = ("tiny", "smollm2-135m-arith", "smollm2-135m-reasoning")
SHORT = ["--max_steps", "2", "--task_eval_steps", "0", "--save_strategy", "no", "--report_to", "none"]


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """The resident set's peak above its value at entry, sampled every 2 ms."""

    def __enter__(self):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        self.base = self.peak = rss()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, rss())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, rss())

    @property
    def delta(self) -> int:
        return self.peak - self.base


def measure_terms() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from hf_grpo.training import shared_prompts

    recipe, _ = load_recipe([str(REPO / "recipes" / "smollm2-135m-arith.yaml")], for_run=False)
    plan, _ = memory_plan(recipe)
    s, shape = plan.settings, plan.shape
    torch.manual_seed(0)
    with PeakRSS() as load:
        model = AutoModelForCausalLM.from_pretrained(registry.model_dir(MODEL), dtype=torch.float32)
        for p in model.parameters():  # touch every page of the memory-mapped weights
            p.data.sum()
    add_fused_lm_head(model, temperature=1.0)
    model = get_peft_model(model, LoraConfig(r=s.lora_r, lora_alpha=32, target_modules=s.lora_targets))
    model.train()
    planned = {t.name: t.nbytes for t in mp.training_terms(shape, s)[0]}
    print(f"weights: measured {mp.gb(load.delta)} resident, planned {mp.gb(planned['frozen base weights'])}")
    shared_prompts.install(model.get_base_model())  # as hf_grpo's trainer scores a micro-batch (shared_prompts)
    rows, prompt, completion = s.per_device_batch, s.prompt_tokens, s.completion_tokens
    distinct = min(rows, max(s.prompts_per_generation // s.processes, 1))  # the plan's bound on distinct prompts
    prompts = torch.randint(0, shape.vocab, (distinct, prompt)).repeat_interleave(rows // distinct, 0)  # [R, P]
    ids = torch.cat([prompts, torch.randint(0, shape.vocab, (rows, completion))], 1)  # [R, P+C]
    mask = torch.ones_like(ids)
    mask[: rows // distinct, :10] = 0  # left padding on one prompt's rows, as prompts of unequal length have
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    for _ in range(2):  # the first pass also pages in what the forward touches first
        saved.clear()
        with PeakRSS() as step:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                logps, _ = shared_prompts.completion_logps(model, ids, mask, completion, None)
            logps.sum().backward()
        del logps
        model.zero_grad(set_to_none=True)
    counted = sum(saved.values())
    phases = {t.name.split(",")[0]: t.nbytes for t in mp.phase_terms(shape, s, mp.CPU_ALLOCATOR_FACTOR)}
    print(
        f"one micro-batch ({rows} rows of {distinct} prompts x {prompt} + {completion} tokens, shared prompts), "
        f"forward + backward: autograd saved {mp.gb(counted)}; resident peak {mp.gb(step.delta)} "
        f"({step.delta / counted:.2f} a saved byte); planned {mp.gb(phases['training micro-batch'])}"
    )
    from hf_grpo.training.warm_start import sft_loss

    ws_rows, gold = s.warm_start_batch, mp.GOLD_TOKENS
    ws_ids = torch.randint(0, shape.vocab, (ws_rows, s.prompt_tokens + gold))
    ws_labels = torch.full_like(ws_ids, -100)
    ws_labels[:, -gold:] = ws_ids[:, -gold:]
    batch = {"input_ids": ws_ids, "attention_mask": torch.ones_like(ws_ids), "labels": ws_labels}
    for _ in range(2):
        with PeakRSS() as warm:
            sft_loss(model, batch).backward()
        model.zero_grad(set_to_none=True)
    print(f"warm-start step ({ws_rows} x {ws_ids.shape[1]} tokens): resident peak {mp.gb(warm.delta)}; planned "
          f"{mp.gb(phases['warm start'])}")  # fmt: skip
    model.eval()
    prompts = torch.randint(0, shape.vocab, (s.eval_batch, s.eval_prompt_tokens))
    with torch.no_grad(), PeakRSS() as evaluation:
        model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                       max_new_tokens=s.eval_completion_tokens, min_new_tokens=s.eval_completion_tokens)  # fmt: skip
    print(f"evaluation batch ({s.eval_batch} x {s.eval_prompt_tokens + s.eval_completion_tokens} tokens, greedy): "
          f"resident peak {mp.gb(evaluation.delta)}; planned {mp.gb(phases['evaluation'])}")  # fmt: skip


def measure_lengths() -> None:
    """The plan's prompt lengths (PROMPT_TOKENS, GOLD_TOKENS) against the embedded data through SmolLM2's tokenizer:
    the 99th percentile of the prompts as TRL tokenizes them, and the longest worked solution."""
    from transformers import AutoTokenizer

    from hf_grpo.data import load_grpo_datasets
    from hf_grpo.evaluation.core import prompt_token_ids

    tokenizer = AutoTokenizer.from_pretrained(registry.model_dir(MODEL))
    recipe, _ = load_recipe([str(REPO / "recipes" / "smollm2-135m-arith.yaml")], for_run=False)
    train, test = load_grpo_datasets(recipe.data, seed=0)
    for name, rows in ((recipe.data.dataset_name, train), (recipe.data.eval_dataset_name, test)):
        lengths = sorted(len(prompt_token_ids(tokenizer, p)) for p in rows["prompt"][:2000])
        p99 = lengths[int(0.99 * (len(lengths) - 1))]
        print(
            f"prompts of {name}: 99th percentile {p99} tokens, longest {lengths[-1]}; planned {mp.PROMPT_TOKENS[name]}"
        )
    gold = max(len(tokenizer(answer)["input_ids"]) for answer in train["answer"][:2000])
    print(f"worked solutions: longest {gold} tokens; planned {mp.GOLD_TOKENS}")


def tree_hwm(root: int) -> int:
    """The largest VmHWM among ``root`` and its descendants (bytes)."""
    best, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                best = max(best, int(line.split()[1]) * 1024)
        todo += [int(c) for c in children]
    return best


def measure_run(name: str) -> tuple[int, int, str]:
    """(measured peak, planned peak, the plan's largest phase) of a shortened run of recipes/NAME.yaml."""
    path = str(REPO / "recipes" / f"{name}.yaml")
    recipe, _ = load_recipe([path], for_run=False)
    plan, _ = memory_plan(recipe)
    device = plan.devices[0]
    s = plan.settings
    extra = ["--warm_start_steps", "2"] if s.warm_start_batch else []
    extra += ["--arithmetic_eval_size", str(s.eval_batch)]  # one whole evaluation batch
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "hf_grpo.train", path, "--output_dir", out, *SHORT, *extra]
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak = 0
        while process.poll() is None:
            peak = max(peak, tree_hwm(process.pid))
            time.sleep(0.2)
        stderr = process.stderr.read()
        if process.returncode != 0:
            raise SystemExit(f"{name}: the run failed ({process.returncode}):\n{stderr[-3000:]}")
    return peak, device.peak, device.peak_phase.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES))
    parser.add_argument("--terms-only", action="store_true")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M')}")
    if registry.is_ready(MODEL):
        measure_lengths()
        measure_terms()
    else:
        print(f"terms: skipped, {MODEL} is not here (hf-grpo model get {MODEL})")
    if args.terms_only:
        return
    print(f"{'recipe':<26} {'measured':>10} {'planned':>10} {'plan/measured':>14}  the plan's largest phase")
    for name in args.recipes:
        measured, planned, phase = measure_run(name)
        print(f"{name:<26} {mp.gb(measured):>10} {mp.gb(planned):>10} {planned / measured - 1:>+14.0%}  {phase}")


if __name__ == "__main__":
    main()
