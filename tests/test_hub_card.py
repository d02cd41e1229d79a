"""The model card's metadata without a push: base model and datasets of a Hub base, the model-index from the
evaluation settings (or an older run's recipe), the license, local paths removed, and which sample completions the
card shows. The push itself and the card it uploads are in test_hub.py."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from huggingface_hub import ModelCard

from hf_grpo.publish.card import model_card
from hf_grpo.publish.run_result import pick_samples


def test_card_metadata_for_a_hub_base_and_dataset(tmp_path):
    (tmp_path / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-Math-1.5B", "r": 8, "lora_alpha": 16})
    )
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    (tmp_path / "recipe.yaml").write_text(
        "model_name_or_path: Qwen/Qwen2.5-Math-1.5B\ndataset_name: gsm8k\nreward_funcs: [gsm8k_correctness]\n"
    )
    card = model_card(tmp_path, "me/qwen-grpo")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["base_model"] == "Qwen/Qwen2.5-Math-1.5B" and meta["datasets"] == ["openai/gsm8k"]
    assert 'AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-Math-1.5B")' in card
    assert "no before/after evaluation" in card

    merged = yaml.safe_load(model_card(tmp_path, "me/qwen-grpo", merged=True).split("---\n")[1])
    assert merged["library_name"] == "transformers" and merged["base_model_relation"] == "merge"


def _fake_run(out: Path, recipe: str, results: dict | None) -> None:
    (out / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-Math-1.5B", "r": 8}))
    (out / "adapter_model.safetensors").write_bytes(b"")
    (out / "recipe.yaml").write_text(recipe)
    if results is not None:
        (out / "eval_results.json").write_text(json.dumps(results))


def _results(before: int, after: int, settings: dict | None = None) -> dict:
    def counts(correct):
        return {"accuracy": correct / 10, "correct": correct, "wrong": 10 - correct, "unparseable": 0, "total": 10}

    return {"before": counts(before), "after": counts(after), **({"settings": settings} if settings else {})}


HUB_RECIPE = (
    "# resolved from /home/someone/recipes/qwen.yaml and the command line; every other key has its default\n"
    "model_name_or_path: Qwen/Qwen2.5-Math-1.5B\ndataset_name: gsm8k\nreward_funcs: [gsm8k_correctness]\n"
    "output_dir: /home/someone/runs/qwen\nloss_type: grpo\ndynamic_sampling: false\n"
)


def test_model_index_from_settings_or_from_an_older_runs_recipe(tmp_path):
    settings = {"task": "gsm8k", "dataset": "openai/gsm8k", "dataset_config": "main", "split": "test"}
    settings.update(num_problems=10, decoding="greedy", max_new_tokens=512, prompt_style="chat")
    _fake_run(tmp_path, HUB_RECIPE, _results(3, 6, settings))
    card = model_card(tmp_path, "me/qwen-grpo")
    data = ModelCard(card).data
    assert data.base_model == "Qwen/Qwen2.5-Math-1.5B" and data.datasets == ["openai/gsm8k"]
    assert "license" not in data.to_dict() and "Not set. This model derives from" in card
    assert [(r.dataset_type, r.dataset_config, r.dataset_split, r.metric_value) for r in data.eval_results] == [
        ("openai/gsm8k", "main", "test", 0.6),
        ("openai/gsm8k", "main", "test", 0.3),
    ]
    assert "(at most 512 new tokens) on 10 held-out problems of openai/gsm8k, config `main`, split `test`" in card
    assert "2402.03300" in card and "2503.14476" not in card  # no DAPO: neither its loss nor dynamic sampling
    assert "someone" not in card and "# resolved from qwen.yaml and the command line" in card
    assert "\noutput_dir: qwen\n" in card

    assert ModelCard(model_card(tmp_path, "me/qwen-grpo", license="mit")).data.license == "mit"

    # a local data file is named by its file name only
    _fake_run(tmp_path, HUB_RECIPE, _results(3, 6, {**settings, "dataset": "/data/x/problems.jsonl"}))
    (result, _) = ModelCard(model_card(tmp_path, "me/qwen-grpo")).data.eval_results
    assert (result.dataset_type, result.dataset_name) == ("problems.jsonl", "problems.jsonl (local file)")

    # an older run without "settings": the dataset comes from the recipe
    _fake_run(tmp_path, HUB_RECIPE, _results(3, 6))
    (after, before) = ModelCard(model_card(tmp_path, "me/qwen-grpo")).data.eval_results
    assert (after.dataset_type, after.dataset_split, after.metric_value, before.metric_value) == (
        "openai/gsm8k",
        "test",
        0.6,
        0.3,
    )

    # no evaluation at all: no model-index (and no stray model_name key)
    (tmp_path / "eval_results.json").unlink()
    meta = ModelCard(model_card(tmp_path, "me/qwen-grpo")).data.to_dict()
    assert "model-index" not in meta and "model_name" not in meta and "metrics" not in meta


def test_sample_picking_prefers_fixed_problems_and_tops_up():
    records = [{"index": i, "grade": "correct" if i % 3 == 0 else "wrong"} for i in range(12)]  # 0 3 6 9 correct
    before = {0: "correct", 3: "correct", 6: "wrong", 9: "wrong"}
    picked = pick_samples(records, before)
    assert [r["index"] for r in picked] == [6, 9, 0, 1, 2]  # wrong -> right first, then in held-out order
    assert [r["index"] for r in pick_samples(records[:4])] == [0, 3, 1, 2]  # 2 right, 2 wrong: all of them
    assert len(pick_samples([{"index": i, "grade": "wrong"} for i in range(9)])) == 5  # no right: 5 wrong
