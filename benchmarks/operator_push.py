"""Which operations GRPO's first steps push up or down: the warm-started policy sampled on training stories as GRPO
samples them, each worked line's operation weighted by its completion's advantage.

    python benchmarks/operator_push.py RUN_DIR                # a run of a word_problems recipe with a warm start
    python benchmarks/operator_push.py RUN_DIR --prompts 96 --adapter RUN_DIR/warm_start

What it does: reads the run's ``recipe.yaml`` (``word_problems_max_steps``, ``word_problems_named_lines``,
``word_problems_compare``, ``num_generations``, ``temperature``, ``max_completion_length``, ``prompt_template``),
draws ``--prompts`` training stories of the run's seed (``make_train``), puts the recipe's instruction on every
other one (the recipes' ``prompt_template_share: 0.5``), samples ``num_generations`` completions each with HF
generate at the recipe's temperature from the adapter (default: the run's ``warm_start/``), grades them with
``hash_correctness`` and keeps the groups whose grades differ (dynamic sampling's rule, on correctness alone: the
format bonus is left out). A completion's advantage is its grade minus the group's mean over the group's standard
deviation (``scale_rewards: group``). For each operation (``+ - * /``) it prints how often the kept completions
wrote it against the gold lines of those groups (times the group size), and its push: the sum over kept completions
of the advantage times the share of the completion's worked lines that use the operation (a completion that writes
more lines weighs no more). Advantages sum to 0 in a group, so a negative push says the right answers used the
operation less than the wrong ones: GRPO's first steps push it down, wherever the stories use it. Then the pushes by
the gold solution's operations, to show where they come from. 2 cores: about 5 minutes for 96 prompts.

Why (docs/results.md, "What GRPO's first steps push"): on reasoning seed 0 every variant tried took the held-out
kinds that need one multiplication (``groups``, ``price``) down under GRPO and the sums and sharing up; this measures
whether the policy GRPO starts from is pushed off an operation by the stories where it wrote one wrongly.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
from pathlib import Path

import torch
import yaml


LINE_OP = re.compile(r"\d+\s*([-+*/])\s*\d+\s*=")  # the operation of a worked line 'a op b = c'
OPS = "+-*/"


def sample_groups(model, tokenizer, prompts: list[str], generations: int, temperature: float, max_new: int):
    """``generations`` completions of each prompt (a chat user turn), one generate call per prompt."""
    for prompt in prompts:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        batch = tokenizer([text] * generations, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(  # [G, P + T]
                **batch, do_sample=True, temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=max_new,
                pad_token_id=tokenizer.eos_token_id,
            )  # fmt: skip
        yield tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def main(argv: list[str] | None = None) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_grpo.data.word_problems import make_train
    from hf_grpo.models.registry import resolve
    from hf_grpo.rewards.functions import hash_correctness
    from hf_grpo.training.dynamic_sampling import keep_mask

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a run's output folder (its recipe.yaml and warm_start/)")
    p.add_argument("--adapter", type=Path, help="the adapter to sample (default: RUN/warm_start)")
    p.add_argument("--prompts", type=int, default=96, help="training stories to sample (default: 96)")
    args = p.parse_args(argv)
    adapter = args.adapter or args.run / "warm_start"
    if not (args.run / "recipe.yaml").is_file():
        p.error(f"{args.run} has no recipe.yaml: pass the output folder of a run (hf-grpo train writes it there)")
    if not (adapter / "adapter_config.json").is_file():
        p.error(f"{adapter} holds no adapter: pass a run that warm-started, or --adapter FOLDER")
    recipe = yaml.safe_load((args.run / "recipe.yaml").read_text())
    seed = int(recipe.get("seed", 0))
    torch.manual_seed(seed)
    path = resolve(recipe["model_name_or_path"]) or recipe["model_name_or_path"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), adapter).eval()
    stories = make_train(  # the run's own training set (hf_grpo.data.loaders builds it with the same arguments)
        recipe.get("arithmetic_train_size", 4000),
        seed,
        recipe.get("word_problems_max_steps", 3),
        recipe.get("word_problems_named_lines", False),
        recipe.get("word_problems_compare", False),
    )
    stories = random.Random(seed).sample(stories, args.prompts)
    template = recipe.get("prompt_template", "{question}")
    prompts = [template.format(question=s["question"]) if i % 2 else s["question"] for i, s in enumerate(stories)]
    G = recipe.get("num_generations", 8)
    print(f"{adapter}: {args.prompts} training stories of seed {seed}, {G} samples each at temperature "
          f"{recipe.get('temperature', 1.0)}, {recipe.get('max_completion_length', 64)} tokens; graded by "
          "hash_correctness")  # fmt: skip
    uses, gold_uses, push = collections.Counter(), collections.Counter(), collections.Counter()
    by_gold = collections.defaultdict(collections.Counter)
    kept = 0
    groups = sample_groups(
        model, tokenizer, prompts, G, recipe.get("temperature", 1.0), recipe.get("max_completion_length", 64)
    )
    for story, completions in zip(stories, groups, strict=True):
        grades = torch.tensor(hash_correctness(completions, solution=[f"#### {story['solution']}"] * G))  # [G]
        if not keep_mask(grades, G).item():  # dynamic sampling's rule
            continue
        kept += 1
        advantages = (grades - grades.mean()) / (grades.std() + 1e-4)  # [G]
        gold = "".join(LINE_OP.findall(story["answer"]))
        gold_uses.update(gold)
        for completion, advantage in zip(completions, advantages.tolist(), strict=True):
            ops = LINE_OP.findall(completion)
            uses.update(ops)
            for op in set(ops):
                share = ops.count(op) / len(ops)
                push[op] += advantage * share
                by_gold[gold][op] += advantage * share
    print(f"kept {kept} of {args.prompts} groups (grades differ)")
    print("operation  written  in gold (x G)  push (advantage x share of the lines)")
    for op in OPS:
        print(f"    {op}      {uses[op]:6d}  {gold_uses[op] * G:12d}  {push[op]:+8.2f}")
    print("by the gold solution's operations (the six with the largest pushes):")
    ranked = sorted(by_gold.items(), key=lambda kv: -sum(abs(v) for v in kv[1].values()))[:6]
    for gold, sums in ranked:
        print(f"  gold {gold:4s} " + "  ".join(f"{op} {sums[op]:+6.2f}" for op in OPS))


if __name__ == "__main__":
    main()
