"""Progress bars where a user waits (hf_grpo.base.progress): the warm start, evaluations, the evaluate command and extra
dynamic-sampling rounds report real counts on a terminal, and draw nothing when stderr is not a terminal, on a
process other than the main one, or with the trainer's ``disable_tqdm``.

``bars`` records every bar hf_grpo creates (real ``tqdm.auto`` bars, only recorded); ``terminal`` replaces stderr
with a stream that says it is a terminal, as a user's shell is, so that the automatic mode shows the bars.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from collections.abc import Iterator

import pytest
import torch

import hf_grpo.base.progress
from hf_grpo.data.arithmetic import make_split
from hf_grpo.models.tiny import build_model, build_tokenizer
from hf_grpo.training.warm_start import arithmetic_examples, warm_start

from .helpers import reward_scripts
from .helpers.common import tiny_config
from .helpers.trainers import make_trainer


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def bars(monkeypatch) -> list:
    created = []

    class Recorded(hf_grpo.base.progress.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.shown = not self.disable  # close() disables a bar: remember whether it was drawn
            created.append(self)

    monkeypatch.setattr(hf_grpo.base.progress, "tqdm", Recorded)
    return created


@contextlib.contextmanager
def terminal() -> Iterator[Terminal]:
    """stderr is a terminal inside the block (set in the test itself: pytest resets ``sys.stderr`` after fixtures)."""
    stream = Terminal()
    with contextlib.redirect_stderr(stream):
        yield stream


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tokenizer()
    return build_model(tokenizer), tokenizer


def few_examples():
    return arithmetic_examples(n_problems=40)


def test_warm_start_bar_counts_the_steps_and_shows_the_loss(tiny, bars):
    model, tokenizer = tiny
    with terminal() as stderr:
        losses = warm_start(model, tokenizer, steps=3, batch_size=2, examples=few_examples())

    [bar] = bars
    assert bar.shown and (bar.desc, bar.total, bar.n) == ("warm start", 3, 3)
    assert bar.postfix == f"loss={losses[-1]:.3f}"
    assert "warm start" in stderr.getvalue() and "/3 [" in stderr.getvalue()  # (tqdm draws at most every 0.1 s)


def test_no_bar_when_stderr_is_not_a_terminal_unless_forced(tiny, bars, capsys):
    model, tokenizer = tiny
    warm_start(model, tokenizer, steps=1, batch_size=2, examples=few_examples())  # stderr captured: not a terminal
    assert not any(bar.shown for bar in bars) and capsys.readouterr().err == ""  # (log lines after 30 s instead)

    with hf_grpo.base.progress.progress_bar(2, "forced", enabled=True) as bar:
        bar.update(2)
    assert bars[-1].shown and "forced:" in capsys.readouterr().err

    with terminal() as stderr, hf_grpo.base.progress.progress_bar(2, "off", enabled=False) as bar:
        bar.update(2)
    assert not bars[-1].shown and stderr.getvalue() == ""


def test_only_the_main_process_draws(bars, monkeypatch):
    monkeypatch.setattr(hf_grpo.base.progress, "is_main_process", lambda: False)
    with terminal() as stderr, hf_grpo.base.progress.progress_bar(2, "rank 1", enabled=True) as bar:
        bar.update(2)
    assert not bars[-1].shown and stderr.getvalue() == ""


def test_trainer_disable_tqdm_turns_the_bars_off(bars):
    assert hf_grpo.base.progress.enabled_for(tiny_config("unused", disable_tqdm=True)) is False
    assert hf_grpo.base.progress.enabled_for(tiny_config("unused", disable_tqdm=False)) is None
    with terminal() as stderr:
        with hf_grpo.base.progress.DeferredBar(4, "rounds", enabled=False) as bar:
            bar.show(1, "round 2/3")
        assert not bars[-1].shown and stderr.getvalue() == ""
        with hf_grpo.base.progress.DeferredBar(4, "rounds") as bar:
            assert len(bars) == 1, "a deferred bar is created at its first show()"
            bar.show(3, "round 2/3")
    assert bars[-1].shown and "rounds" in stderr.getvalue() and "3/4" in stderr.getvalue()


def test_evaluation_bars_count_problems_and_completions(tiny, bars, monkeypatch):
    from datasets import Dataset

    from hf_grpo.evaluation import core
    from hf_grpo.rewards.wrapper import RewardPool

    model, tokenizer = tiny
    problems = make_split("test", 4, seed=0)
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": p["question"]}] for p in problems],
            "solution": [p["answer"] for p in problems],
        }
    )
    options = dict(max_new_tokens=4, num_samples=2, batch_size=2, grade_timeout=30)
    monkeypatch.setattr(core, "GRADE_PROGRESS_SLICE", 1)  # slices of max(1, workers x max_chunk) = 2 completions
    with RewardPool(num_workers=1, max_chunk=2) as pool:
        torch.manual_seed(0)
        shown = core.evaluate(model, tokenizer, dataset, "gsm8k", pool=pool, progress=True, label="before", **options)
        torch.manual_seed(0)
        hidden = core.evaluate(model, tokenizer, dataset, "gsm8k", pool=pool, progress=False, **options)

    assert [(b.desc, b.total, b.n) for b in bars if b.shown] == [
        ("before: generate", 4, 4),
        ("before: sample 2", 4, 4),
        ("before: grade", 12, 12),  # 4 greedy completions + 4 x 2 samples
    ]
    assert shown.records == hidden.records, "grading in slices for the bar changed a grade"


def test_evaluate_command_draws_its_bars_on_stderr_when_asked(tiny_model_dir, bars, capsys):
    from hf_grpo.evaluate import evaluate_run, parse_args

    argv = [str(tiny_model_dir), "--max-samples", "3", "--max-new-tokens", "4", "--batch-size", "2"]
    assert parse_args(argv).progress is None and parse_args([*argv, "--no-progress"]).progress is False
    result = evaluate_run(str(tiny_model_dir), parse_args([*argv, "--progress"]))  # stderr is no terminal here
    out, err = capsys.readouterr()
    assert result.total == 3 and out == "", "bars never go to stdout, where the command prints its summary"
    assert "evaluate: generate" in err and "evaluate: grade" in err
    assert [(b.desc, b.total, b.n) for b in bars if b.shown] == [
        ("evaluate: generate", 3, 3),
        ("evaluate: grade", 3, 3),
    ]


def test_extra_dynamic_sampling_rounds_show_one_bar_per_step(tiny, bars, caplog, tmp_path):
    from hf_grpo.data import DataArguments, load_grpo_datasets

    model, tokenizer = tiny
    train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=64, arithmetic_eval_size=4))
    trainer = make_trainer(
        tmp_path,
        model=copy.deepcopy(model),
        tokenizer=tokenizer,
        reward_funcs=reward_scripts.always_zero,  # no group ever has signal: all 3 rounds run
        train_dataset=train,
        max_steps=1,
        dynamic_sampling=True,
        max_generation_batches=3,
        max_completion_length=4,
        per_device_train_batch_size=8,
        disable_tqdm=False,  # the Trainer's own bar is drawn too (not recorded: transformers' tqdm)
    )
    with caplog.at_level(logging.DEBUG, logger="hf_grpo"), terminal() as stderr:
        trainer.train()

    [bar] = [b for b in bars if b.desc == "step 1: dynamic sampling"]
    assert bar.shown and (bar.total, bar.n) == (2, 0)  # 8 rows / 4 generations: 2 groups needed, none ever ready
    assert bar.postfix == "round 3/3, 0/4 groups kept"  # shown before the last round (4 = 2 rounds x 2 groups)
    rounds = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dynamic sampling, step 1 round")]
    assert rounds == [f"dynamic sampling, step 1 round {k}/3: 0/2 groups kept, 0/2 ready" for k in (1, 2, 3)]
    assert "step 1: dynamic sampling" in stderr.getvalue()
