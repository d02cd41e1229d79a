"""Overlapped generation's ``Lookahead`` (``generation.overlap``, hf_grpo/generation/overlap.py), tier 1, in-process,
against a fake generator, trainer and dataloader: which round is generated now and which is sent ahead (seed keys,
adapter, version, the dataloader's next cycle's batch; further rounds from dynamic sampling's ``PromptStream``), epoch
ends, adapters in use, errors re-raised, checkpoints. Whole runs and the recipe checks: tests/test_overlap_runs.py.

    .venv/bin/python -m pytest -q tests/test_overlap.py
"""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest

from hf_grpo.generation import overlap
from hf_grpo.generation.overlap import STATE_FILE, Lookahead
from hf_grpo.generation.vllm_client import VLLMConnectionError
from hf_grpo.training.dynamic_sampling import DynamicSampler, PromptStream


# ----------------------------------------------------------------------------------------------------------------------
# Lookahead with a fake generator and trainer


class FakeGenerator:
    """Records every ``generate`` call; answers deterministically (a NaN log-prob included). ``hold``: background
    calls (those naming an adapter) wait for it; ``fail``: they raise it."""

    def __init__(self):
        self.adapter_name = "policy-0"
        self.client = SimpleNamespace(worst_case_s=5.0, max_concurrent_requests=4)
        self.restart_wait = 0.0
        self.calls: list[dict] = []
        self.hold = threading.Event()
        self.hold.set()
        self.fail: BaseException | None = None

    def generate(self, prompt_ids, num_generations, step, adapter=None, seed_key=None):
        self.calls.append(
            {
                "thread": threading.current_thread().name,
                "adapter": adapter,
                "seed_key": seed_key,
                "step": step,
                "prompt_ids": prompt_ids,
            }
        )
        if adapter is not None:
            assert self.hold.wait(10)
            if self.fail is not None:
                raise self.fail
        completions = [[len(ids), i] for i, ids in enumerate(prompt_ids)]
        logprobs = [[-0.5, float("nan")] for _ in prompt_ids]
        return completions, logprobs


class FakeTrainer:
    def __init__(self, size=40, rank=0, processes=2):
        self.state = SimpleNamespace(global_step=0)
        self.accelerator = SimpleNamespace(process_index=rank, num_processes=processes)
        self.train_dataset = [{"prompt": f"question {i}"} for i in range(size)]

    def _tokenize_prompts(self, prompts):
        return ([[int(word) for word in p.split()[1:]] + [7] for p in prompts],)


G = 2  # num_generations


def tokenize(trainer, prompts):
    """What the trainer hands Lookahead as ``tokenize``: TRL's ``_tokenize_prompts``' prompt ids."""
    return trainer._tokenize_prompts(prompts)[0]


def prompt_ids_of(trainer, rows):
    """The prompt ids TRL generates for: every row of the process's batch, tokenized."""
    return trainer._tokenize_prompts([r["prompt"] for r in rows])[0]


def epoch(trainer, groups=2, count=6, start=0):
    """A dataloader's epoch iterator as TRL's yields it to a process: batch ``b`` holds rows ``(start + b) * groups``
    onwards, one per group, each ``G`` times in a row."""
    rows = trainer.train_dataset
    first = [(start + b) * groups for b in range(count)]
    return iter([[rows[(f + g) % len(rows)] for g in range(groups) for _ in range(G)] for f in first])


def lookahead(generator, trainer, max_staleness=1, cycle_steps=1, accumulation=1):
    return Lookahead(generator, max_staleness, cycle_steps, G, accumulation, tokenize=lambda p: tokenize(trainer, p))


def cycle(ahead, trainer, batches):
    """One optimizer step with one generation, as the trainer runs it: its batch (transformers'
    ``get_batch_samples``), its first round, then TRL's generation for it."""
    (inputs,) = ahead.take(batches, 1)
    ahead.first_round(trainer.state.global_step, inputs)
    return inputs, ahead.generate(trainer.state.global_step, prompt_ids_of(trainer, inputs), G)


def test_the_first_round_is_generated_now_and_the_next_batch_is_sent_ahead_with_the_current_adapter():
    gen, trainer = FakeGenerator(), FakeTrainer()
    ahead, expected, batches = lookahead(gen, trainer), epoch(trainer), epoch(trainer)
    rows, result = cycle(ahead, trainer, batches)
    assert rows == next(expected)  # the dataloader's batch, as a synchronous run trains on it
    now = gen.calls[0]
    assert now["thread"] == threading.main_thread().name and now["adapter"] is None
    assert now["seed_key"] == (0, "overlap-0") and result[0] == [[len(i), k] for k, i in enumerate(now["prompt_ids"])]
    assert ahead.last_version == 0
    (planned,) = ahead.planned
    assert planned.done.wait(10)
    sent = gen.calls[1]
    assert sent["thread"] != threading.main_thread().name
    assert (sent["adapter"], sent["seed_key"], sent["step"]) == ("policy-0", (1, "overlap-0"), 0)
    second = next(expected)
    assert (planned.step, planned.index, planned.version, planned.rows) == (1, 0, 0, second)

    trainer.state.global_step, gen.adapter_name = 1, "policy-1"
    rows, result = cycle(ahead, trainer, batches)
    assert rows == second  # the batch read ahead is handed to the trainer at its step
    assert sent["prompt_ids"] == prompt_ids_of(trainer, rows)  # what was sent is what step 1 trains on
    assert result == planned.result and ahead.last_version == 0  # generated by policy 0, trained at step 1
    assert [c["seed_key"] for c in gen.calls] == [(0, "overlap-0"), (1, "overlap-0"), (2, "overlap-0")]
    assert gen.calls[2]["adapter"] == "policy-1" and ahead.planned[0].rows == next(expected)


def test_max_staleness_two_sends_two_cycles_ahead():
    gen, trainer = FakeGenerator(), FakeTrainer()
    ahead, batches, expected = lookahead(gen, trainer, max_staleness=2), epoch(trainer), epoch(trainer)
    cycle(ahead, trainer, batches)
    assert [(r.step, r.version) for r in ahead.planned] == [(1, 0), (2, 0)]
    next(expected)
    assert [r.rows for r in ahead.planned] == [next(expected), next(expected)]
    trainer.state.global_step = 1
    cycle(ahead, trainer, batches)
    assert [(r.step, r.version) for r in ahead.planned] == [(2, 0), (3, 1)]
    assert ahead.planned[1].rows == next(expected)


@pytest.mark.parametrize(("cycle_steps", "accumulation", "sent"), [(1, 2, 2), (2, 1, 2), (2, 2, 4)])
def test_the_batch_sent_ahead_is_the_first_of_the_next_cycle(cycle_steps, accumulation, sent):
    """With gradient accumulation a step takes several batches, and with several updates per generation a cycle takes
    several steps: the round sent ahead is the batch that starts the next cycle (batch ``sent`` of the epoch)."""
    gen, trainer = FakeGenerator(), FakeTrainer(size=64)
    ahead = lookahead(gen, trainer, max_staleness=cycle_steps, cycle_steps=cycle_steps, accumulation=accumulation)
    batches, expected = epoch(trainer, count=8), list(epoch(trainer, count=8))
    inputs = ahead.take(batches, accumulation)
    assert inputs == expected[:accumulation]
    ahead.first_round(trainer.state.global_step, inputs[0])
    ahead.generate(trainer.state.global_step, prompt_ids_of(trainer, inputs[0]), G)
    (planned,) = ahead.planned
    assert (planned.step, planned.rows) == (cycle_steps, expected[sent])
    assert ahead.take(batches, accumulation) == expected[accumulation : 2 * accumulation]  # nothing skipped


def test_the_first_cycle_of_an_epoch_is_generated_on_arrival():
    """No batch of the next epoch exists while the last step of an epoch trains: nothing is sent, and the next epoch's
    first round is generated when its step starts (lag 0), with the new epoch's iterator."""
    gen, trainer = FakeGenerator(), FakeTrainer()
    ahead, batches = lookahead(gen, trainer), epoch(trainer, count=2)
    cycle(ahead, trainer, batches)
    trainer.state.global_step = 1
    cycle(ahead, trainer, batches)  # the epoch's last batch: read ahead finds its end
    assert list(ahead.planned) == [] and len(gen.calls) == 2
    trainer.state.global_step, gen.adapter_name = 2, "policy-2"
    rows, _ = cycle(ahead, trainer, epoch(trainer, start=5))
    assert rows == next(epoch(trainer, start=5)) and ahead.last_version == 2
    assert gen.calls[2]["adapter"] is None and gen.calls[3]["adapter"] == "policy-2"


def test_only_a_cycles_first_round_is_sent_ahead_and_further_rounds_use_the_current_adapter():
    """Dynamic sampling's further rounds are drawn from the prompt stream and generated during their own cycle, with
    the adapter being trained (lag 0): sending them ahead too made nearly every group one update old, and learning
    fell behind."""
    gen, trainer = FakeGenerator(), FakeTrainer(rank=1, processes=2)
    ahead, batches = lookahead(gen, trainer), epoch(trainer)
    cycle(ahead, trainer, batches)
    trainer.state.global_step, gen.adapter_name = 1, "policy-1"
    cycle(ahead, trainer, batches)  # takes the round planned for step 1 and sends step 2's first round only
    assert [(r.step, r.index, r.version) for r in ahead.planned] == [(2, 0, 1)]
    # a further round of step 1, drawn by dynamic sampling's own code (as in a synchronous run), generated now
    sampler = DynamicSampler(
        trainer.accelerator, trainer.train_dataset, G, seed=0, max_rounds=4, exhausted="fill", pad_token_id=0,
        max_staleness=1, further_round=lambda index, rows: ahead.further_round(trainer.state.global_step, index, rows),
    )  # fmt: skip
    rows = sampler._next_round(2, step=2, index=1)
    drawn = PromptStream(40, 0).next(4)[2:4]  # rank 1's share of 2 groups x 2 processes
    assert rows == [trainer.train_dataset[i] for i in drawn for _ in range(G)]
    assert ahead.current.version == 1 and ahead.current.prompt_ids is None
    calls = len(gen.calls)
    ahead.generate(trainer.state.global_step, prompt_ids_of(trainer, rows), G)
    assert gen.calls[calls]["adapter"] is None and gen.calls[calls]["seed_key"] == (1, "overlap-1")
    assert ahead.last_version == 1 and [(r.step, r.index) for r in ahead.planned] == [(2, 0)]


def test_in_use_names_the_adapters_of_rounds_still_generating():
    gen, trainer = FakeGenerator(), FakeTrainer()
    ahead = lookahead(gen, trainer)
    gen.hold.clear()
    cycle(ahead, trainer, epoch(trainer))
    assert ahead.in_use() == {"policy-0"}
    gen.hold.set()
    assert ahead.planned[0].done.wait(10)
    assert ahead.in_use() == set()


def test_a_process_holding_part_of_each_group_gets_its_rows_sent_ahead():
    """With 2 processes, per_device_train_batch_size 4 and num_generations 8, each process holds half a
    group. The round sent ahead was one row per group x num_generations (8 rows of one prompt) while TRL generates
    for the process's 4 rows: "step 1's prompts changed after they were sent"."""
    gen, trainer = FakeGenerator(), FakeTrainer()
    ahead = Lookahead(gen, max_staleness=1, cycle_steps=1, num_generations=8, tokenize=lambda p: tokenize(trainer, p))
    rows = trainer.train_dataset
    batches = iter([[rows[b]] * 4 for b in range(4)])  # this process's half of group b: its prompt 4 times

    def step(index):
        trainer.state.global_step = index
        (inputs,) = ahead.take(batches, 1)
        ahead.first_round(trainer.state.global_step, inputs)
        return inputs, ahead.generate(trainer.state.global_step, prompt_ids_of(trainer, inputs), 8)

    step(0)
    sent = gen.calls[-1]
    assert sent["adapter"] == "policy-0" and sent["prompt_ids"] == [[1, 7]] * 4  # question 1, 4 rows
    inputs, (completions, _) = step(1)  # the round sent ahead is the one TRL asks for
    assert len(completions) == len(inputs) == 4 and len(gen.calls) == 3


def test_an_error_in_the_background_generation_is_raised_by_the_call_that_needs_it():
    gen, trainer = FakeGenerator(), FakeTrainer()
    ahead, batches = lookahead(gen, trainer), epoch(trainer)
    gen.fail = VLLMConnectionError("the vLLM server at http://x stopped answering (boom 42)")
    cycle(ahead, trainer, batches)  # the background call fails; nothing is raised yet
    assert ahead.planned[0].done.wait(10)
    trainer.state.global_step = 1
    with pytest.raises(VLLMConnectionError, match=r"^the vLLM server at http://x stopped answering \(boom 42\)$"):
        cycle(ahead, trainer, batches)


def test_a_round_that_waits_for_a_restarted_server_is_waited_for(monkeypatch):
    """The training thread gave up after its requests' worst case while the round could still be
    waiting up to ``restart_wait`` for a restarted server (which a synchronous run survives). Here the requests'
    worst case is 0.2 s and the round takes ~1 s, well within ``restart_wait`` (30 s)."""
    monkeypatch.setattr(overlap, "THREAD_SLACK_S", 0.0)
    monkeypatch.setattr(overlap, "HEARTBEAT_S", 0.05)
    gen, trainer = FakeGenerator(), FakeTrainer()
    gen.client.worst_case_s, gen.restart_wait = 0.2, 30.0
    ahead, batches = lookahead(gen, trainer), epoch(trainer)
    gen.hold.clear()
    cycle(ahead, trainer, batches)  # sends step 1's round, which waits on `hold`
    threading.Timer(1.0, gen.hold.set).start()  # the "restarted server" answers after ~1 s
    trainer.state.global_step = 1
    inputs, (completions, _) = cycle(ahead, trainer, batches)
    assert len(completions) == len(inputs)
    # without restart_wait, a round that has not answered after its requests' worst case is given up on
    gen, trainer = FakeGenerator(), FakeTrainer()
    gen.client.worst_case_s = 0.2
    ahead, batches = lookahead(gen, trainer), epoch(trainer)
    gen.hold.clear()
    cycle(ahead, trainer, batches)
    trainer.state.global_step = 1
    try:
        with pytest.raises(VLLMConnectionError, match="has not generated step 1's round 0"):
            cycle(ahead, trainer, batches)
    finally:
        gen.hold.set()


def test_changed_prompts_of_a_round_sent_ahead_are_an_error():
    gen, trainer = FakeGenerator(), FakeTrainer()
    ahead, batches = lookahead(gen, trainer), epoch(trainer)
    cycle(ahead, trainer, batches)
    trainer.state.global_step = 1
    (inputs,) = ahead.take(batches, 1)
    ahead.first_round(trainer.state.global_step, inputs)
    with pytest.raises(RuntimeError, match="step 1's prompts changed"):
        ahead.generate(trainer.state.global_step, [[99]] * len(inputs), G)


def test_save_and_load_give_back_the_planned_rounds(tmp_path):
    gen, trainer = FakeGenerator(), FakeTrainer()
    ahead = lookahead(gen, trainer, max_staleness=2)
    cycle(ahead, trainer, epoch(trainer))
    ahead.save(str(tmp_path), rank=0)
    assert (tmp_path / STATE_FILE.format(rank=0)).is_file()
    again = lookahead(FakeGenerator(), trainer, max_staleness=2)
    again.load(str(tmp_path), rank=0)
    keys = ("step", "index", "version", "prompt_ids")
    assert [[getattr(r, k) for k in keys] for r in again.planned] == [
        [getattr(r, k) for k in keys] for r in ahead.planned
    ]
    for old, new in zip(ahead.planned, again.planned, strict=True):
        assert new.done.is_set() and new.result[0] == old.result[0]
        assert [[x if not math.isnan(x) else "nan" for x in row] for row in new.result[1]] == [
            [-0.5, "nan"] for _ in old.result[1]
        ]
    trainer.state.global_step = 1
    calls = len(gen.calls)
    rows, result = cycle(again, trainer, epoch(trainer, start=1))  # resumed: the dataloader skipped step 0's batch
    assert rows == ahead.planned[0].rows
    assert result[0] == ahead.planned[0].result[0] and len(gen.calls) == calls  # nothing generated again
    with pytest.raises(FileNotFoundError, match="generation.overlap"):
        lookahead(gen, trainer).load(str(tmp_path), rank=1)


def test_a_lowered_max_staleness_is_enforced_on_the_rounds_a_checkpoint_holds(tmp_path, caplog):
    """A run saved with max_staleness 2 holds rounds for steps 1 and 2, both from version 0; resumed
    with max_staleness 1, step 2's round would train two updates old: it is generated again, step 1's is kept."""
    gen, trainer = FakeGenerator(), FakeTrainer()
    ahead = lookahead(gen, trainer, max_staleness=2)
    cycle(ahead, trainer, epoch(trainer))
    assert [(r.step, r.version) for r in ahead.planned] == [(1, 0), (2, 0)]
    ahead.save(str(tmp_path), rank=0)
    again = lookahead(FakeGenerator(), trainer, max_staleness=1)
    again.load(str(tmp_path), rank=0)
    assert [(r.step, r.version) for r in again.planned] == [(1, 0)]
    assert "1 round(s) generated ahead are more than generation.max_staleness 1" in caplog.text
    kept = lookahead(FakeGenerator(), trainer, max_staleness=2)
    kept.load(str(tmp_path), rank=0)  # the same bound keeps both
    assert [(r.step, r.version) for r in kept.planned] == [(1, 0), (2, 0)]


def test_a_staleness_bound_below_the_generation_cycle_is_refused():
    with pytest.raises(ValueError, match=r"generation\.max_staleness 1 is below the 2 optimizer steps"):
        Lookahead(FakeGenerator(), max_staleness=1, cycle_steps=2, num_generations=G)
    assert Lookahead(FakeGenerator(), max_staleness=4, cycle_steps=2, num_generations=G).depth == 2
