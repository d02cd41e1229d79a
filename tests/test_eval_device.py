"""Where an evaluation generates (hf_grpo.evaluation.device), on a machine without a GPU: the choice (a CUDA GPU when
torch sees one, else the CPU, or ``--device``), its one-line errors before anything loads, the log line of ``hf-grpo
eval``, the placement rule inside a training run, and the batch that halves when the accelerator runs out of memory.

Where torch is made to see a GPU (``cuda_visible``), no model is moved there: the tests check the decision and what
``hf-grpo eval`` does with it up to torch's own refusal. tests/test_gpu_eval.py checks where the model runs on a GPU.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch

from hf_grpo import evaluate as hf_evaluate
from hf_grpo.evaluation import core, saved_model
from hf_grpo.evaluation.device import CPU_BATCH, CUDA_BATCH, choose_device, eval_batch_size, place_for_generation
from hf_grpo.models.tiny import build_model, build_tokenizer


@pytest.fixture
def cuda_visible(monkeypatch):
    """torch says one CUDA GPU is there, named "Test GPU" (nothing can run on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Test GPU")


def test_a_visible_gpu_is_chosen_else_the_cpu(monkeypatch, cuda_visible):
    assert choose_device() == torch.device("cuda")
    assert choose_device("cpu") == torch.device("cpu") and choose_device("cuda:0") == torch.device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_device() == torch.device("cpu")


@pytest.mark.parametrize(
    ("requested", "gpu", "message"),
    [
        ("gpu", True, "--device 'gpu' is not a device: pass cpu, cuda or cuda:N"),
        ("cuda:", True, "is not a device"),
        ("cuda:1", True, "this machine has 1 CUDA GPU(s), cuda:0 to cuda:0; pass one"),
        ("cuda", False, "torch sees no CUDA GPU on this machine"),
    ],
)
def test_a_device_that_is_not_there_is_one_line_before_anything_loads(
    requested, gpu, message, tiny_model_dir, monkeypatch, capsys
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(gpu))

    def no_loading(*args, **kwargs):
        raise AssertionError("the model loaded before the device was checked")

    monkeypatch.setattr(saved_model, "load_model", no_loading)
    monkeypatch.setattr(saved_model, "eval_dataset", no_loading)
    assert hf_evaluate.main([str(tiny_model_dir), "--device", requested]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hf_grpo.evaluate: error: ") and message in err


def test_the_eval_command_logs_the_device_it_chose(tiny_model_dir, caplog):
    argv = [str(tiny_model_dir), "--dataset", "arithmetic", "--max-samples", "2", "--max-new-tokens", "2"]
    with caplog.at_level(logging.INFO, logger="hf_grpo"):
        assert hf_evaluate.main(argv) == 0
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evaluating ")]
    assert line.endswith(f"on cpu, {CPU_BATCH} problems per batch"), line


def test_with_a_gpu_the_eval_command_chooses_it_and_moves_the_model_there(tiny_model_dir, cuda_visible, caplog):
    argv = [str(tiny_model_dir), "--dataset", "arithmetic", "--max-samples", "2", "--max-new-tokens", "2"]
    with caplog.at_level(logging.INFO, logger="hf_grpo"), pytest.raises((AssertionError, RuntimeError), match="CUDA"):
        hf_evaluate.evaluate_run(argv[0], hf_evaluate.parse_args(argv))  # torch's CPU build refuses the move
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evaluating ")]
    assert line.endswith(f"on cuda:0 (Test GPU), {CUDA_BATCH} problems per batch"), line


def test_batch_sizes():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (eval_batch_size(cpu), eval_batch_size(cpu, 150), eval_batch_size(cpu, 2)) == (CPU_BATCH, 150, 2)
    # transformers' default (8) is no choice; any other value is, and wins on a GPU too (it floored 16 to 64)
    assert (eval_batch_size(cuda), eval_batch_size(cuda, 150), eval_batch_size(cuda, 8)) == (CUDA_BATCH, 150, 64)
    assert eval_batch_size(cuda, 16) == 16


def test_a_model_on_the_cpu_moves_to_the_accelerator_unless_it_is_sharded():
    """The rule of an evaluation inside training (the trainer places its model only when training starts under
    DeepSpeed or FSDP); "meta" stands in for the accelerator: a device that is not the CPU, on any machine."""
    tokenizer = build_tokenizer()
    accelerator = torch.device("meta")
    assert place_for_generation(build_model(tokenizer), accelerator, sharded=True).type == "cpu"
    assert place_for_generation(build_model(tokenizer), torch.device("cpu")).type == "cpu"
    model = build_model(tokenizer)
    assert place_for_generation(model, accelerator).type == "meta" and next(model.parameters()).is_meta


def test_a_batch_that_does_not_fit_is_halved_until_it_does(caplog):
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    prompts = [[{"role": "user", "content": f"Tom has {n} pens. Tom gets 2 more."}] for n in range(10)]
    original, sizes = model.generate, []

    def generate(input_ids, **kwargs):  # room for 3 sequences at a time
        sizes.append(len(input_ids))
        if len(input_ids) > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(input_ids=input_ids, **kwargs)

    expected = core.generate(model, tokenizer, prompts, max_new_tokens=3, batch_size=2)  # the batches it ends with
    model.generate = generate
    with caplog.at_level(logging.WARNING, logger="hf_grpo"):
        texts = core.generate(model, tokenizer, prompts, max_new_tokens=3, batch_size=16, desc="before: generate")
    assert texts == expected
    assert sizes == [10, 8, 4, 2, 2, 2, 2, 2]  # halved at the first batch, then 2 at a time to the end
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        f"before: generate: out of accelerator memory; {n} problems per batch from here on" for n in (8, 4, 2)
    ]
    with pytest.raises(torch.OutOfMemoryError):  # processes that generate in step cannot halve alone
        core.generate(model, tokenizer, prompts, max_new_tokens=3, batch_size=16, halve_on_oom=False)


def test_a_held_out_evaluation_names_where_it_generated(tmp_path, caplog):
    from datasets import Dataset

    from hf_grpo.evaluation.tasks import TaskEvaluator

    from .helpers.common import tiny_config

    tokenizer = build_tokenizer()
    dataset = Dataset.from_dict({"prompt": ["2 + 2?", "3 + 1?"], "solution": ["#### 4", "#### 4"]})
    evaluator = TaskEvaluator(dataset, "gsm8k", tiny_config(tmp_path, max_completion_length=2))
    try:
        with caplog.at_level(logging.INFO, logger="hf_grpo"):
            summary = evaluator.run(build_model(tokenizer), tokenizer, label="before")
    finally:
        evaluator.close()
    assert summary["total"] == 2
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("held-out accuracy (before): ")]
    assert re.search(r"of 2\), generated on cpu in \d+ s$", line), line
    assert list(evaluator.seconds) == ["before"]
