"""Each distinct prompt run once for its group (hf_grpo/training/shared_prompts.py) gives TRL's numbers: the same
log-probabilities, entropies and gradients as TRL's fused head on whole rows, the same samples from generate, and the
same trained adapter."""

from __future__ import annotations

import functools

import pytest
import torch

from hf_grpo.training import micro_batches, shared_prompts

from .helpers.reward_scripts import alternating
from .helpers.trainers import make_trainer


G, C = 4, 7  # completions per prompt, completion length


@pytest.fixture(scope="module")
def parts():
    """A tiny model with LoRA on every linear layer (random B: an adapter that changes the numbers), TRL's fused
    head and ours installed, and a batch of 3 prompts x G completions with left padding and completion padding."""
    from peft import LoraConfig, get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    from hf_grpo.models.tiny import build_model, build_tokenizer

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)
    model = get_peft_model(model, lora)
    shared_prompts.install(model.get_base_model())
    pad, vocab = tokenizer.pad_token_id, model.config.vocab_size
    prompts = torch.randint(5, vocab, (3, 9))
    prompts[1, :3] = pad  # left padding
    prompts[2, :1] = pad
    prompt_mask = (prompts != pad).long()
    completions = torch.randint(5, vocab, (3 * G, C))
    completions[::3, 4:] = pad  # completions that ended early
    completion_mask = (completions != pad).long()
    ids = torch.cat([prompts.repeat_interleave(G, 0), completions], 1)  # [R, P+C]
    mask = torch.cat([prompt_mask.repeat_interleave(G, 0), completion_mask], 1)
    return model, ids, mask, completion_mask


def trl_way(model, ids, mask):
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-C] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -C:], out.entropy[:, -C:]


def ours(model, ids, mask, batch_size=None):
    return shared_prompts.completion_logps(model, ids, mask, C, batch_size)


def lora_grads(model, logps, completion_mask) -> torch.Tensor:
    model.zero_grad()
    (-(logps * completion_mask).sum()).backward()
    grads = torch.cat([p.grad.flatten() for n, p in model.named_parameters() if "lora_" in n])
    model.zero_grad()
    return grads


@pytest.mark.parametrize("batch_size", [None, 5])  # 5: chunks that split a group
def test_log_probs_entropies_and_gradients_are_trls(parts, batch_size):
    model, ids, mask, completion_mask = parts
    model.train()
    ref_logps, ref_entropy = trl_way(model, ids, mask)
    logps, entropy = ours(model, ids, mask, batch_size)
    real = completion_mask.bool()
    assert torch.allclose(logps[real], ref_logps[real], atol=1e-5)
    assert (logps[~real] == 0).all() and (entropy[~real] == 0).all()  # as TRL's: nothing at padding
    assert torch.allclose(entropy[real], ref_entropy[real], atol=1e-5)
    ref_grads, grads = lora_grads(model, ref_logps, completion_mask), lora_grads(model, logps, completion_mask)
    assert ref_grads.abs().sum() > 0
    assert torch.allclose(grads, ref_grads, atol=1e-5, rtol=1e-4)


def test_a_prompts_rows_get_its_cache_and_the_same_gradient_on_every_call():
    """The rows of a group share their prompt's cache rows, whose gradient sums the group's. Indexing's backward
    (``index_put_`` accumulating) adds them from two threads in a different order on each call: the same seed and
    batch trained a different adapter in its last bits every time and diverged over a run. One prompt's rows (a
    micro-batch of one group), with a cache long enough that both threads add at once even on a busy machine."""
    from transformers import DynamicCache

    torch.manual_seed(0)
    keys, values = torch.randn(1, 3, 2000, 64, requires_grad=True), torch.randn(1, 3, 2000, 64, requires_grad=True)
    rows, upstream = torch.zeros(16, dtype=torch.long), torch.randn(16, 3, 2000, 64)  # [R], [R, heads, P, dim]
    threads, grads = torch.get_num_threads(), set()
    torch.set_num_threads(2)
    try:
        for _ in range(10):
            cache = DynamicCache()
            cache.update(keys, values, 0)
            shared_prompts._select_rows(cache, rows)
            layer = cache.layers[0]
            assert torch.equal(layer.keys, keys[rows]) and torch.equal(layer.values, values[rows])
            grad = torch.autograd.grad((layer.keys * upstream).sum() + (layer.values * upstream).sum(), [keys, values])
            grads.add(b"".join(g.numpy().tobytes() for g in grad))
    finally:
        torch.set_num_threads(threads)
    assert len(grads) == 1


def test_a_repeated_prompt_is_run_once(parts, monkeypatch):
    model, ids, mask, _ = parts
    backbone, seen = model.get_base_model().model, []
    monkeypatch.setattr(
        backbone, "forward", lambda *a, _f=backbone.forward, **k: seen.append(k["input_ids"].shape) or _f(*a, **k)
    )
    with torch.no_grad():
        ours(model, ids, mask)
    assert seen == [(3, 9 - 1), (3 * G, 1 + C)]  # the 3 prompts but their last token; then every row's suffix


def test_prompt_groups_find_identical_prompts_anywhere_and_group_order_puts_them_together():
    prompts = torch.tensor([[0, 1], [0, 1], [2, 3], [0, 1], [5, 5], [2, 3]])
    mask = torch.ones_like(prompts)
    first, which = shared_prompts.prompt_groups(prompts, mask)
    assert torch.equal(prompts[first][which], prompts)  # every row finds its prompt
    assert sorted(first.tolist()) == [0, 2, 4]  # the first row of each
    assert micro_batches.group_order(prompts, mask).tolist() == [0, 1, 3, 2, 5, 4]
    mask[2, 0] = 0  # the same ids with other padding: another prompt
    assert shared_prompts.prompt_groups(prompts, mask)[0].numel() == 4


@pytest.mark.parametrize("do_sample", [True, False])
def test_generate_draws_the_same_samples(parts, do_sample):
    """Sampling from the shared prefill gives the rows the same tokens as HF generate on whole rows, same seed."""
    from transformers import GenerationConfig

    model, ids, mask, _ = parts
    model.eval()
    prompts, prompt_mask = ids[:, :-C], mask[:, :-C]
    config = GenerationConfig(max_new_tokens=6, do_sample=do_sample, temperature=0.7, top_k=0, pad_token_id=0)
    runs = []
    for plain in (True, False):
        torch.manual_seed(3)
        with torch.no_grad():
            if plain:  # the model's own generate, as before install
                base = model.get_base_model()
                out = type(base).generate(
                    base, input_ids=prompts, attention_mask=prompt_mask, generation_config=config
                )
            else:
                out = model.generate(input_ids=prompts, attention_mask=prompt_mask, generation_config=config)
        runs.append(out)
    assert torch.equal(runs[0], runs[1])
    assert runs[0].size(1) > prompts.size(1)


@pytest.mark.parametrize("repeats", [True, False])
def test_rows_that_ended_leave_the_forward_and_every_row_samples_as_before(parts, repeats):
    """A row that sampled its end-of-sequence token runs no further forward (the base model sees fewer rows), and the
    tokens of every row are still HF generate's on whole rows, same seed; also where no prompt repeats (evaluation)."""
    from transformers import GenerationConfig

    model, ids, mask, _ = parts
    model.eval()
    prompts, prompt_mask = ids[:, :-C], mask[:, :-C]
    if not repeats:
        prompts, prompt_mask = prompts[::G], prompt_mask[::G]  # one row of each of the 3 prompts
    base = model.get_base_model()

    def sample(eos: int | None, plain: bool) -> torch.Tensor:
        # with repeats the end-of-sequence token comes in the config (TRL's way), else as an argument (evaluation's)
        config = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=0.7, top_k=0, pad_token_id=0,
                                  eos_token_id=eos if repeats else None)  # fmt: skip
        given = {} if repeats else {"eos_token_id": eos}
        torch.manual_seed(5)
        with torch.no_grad():
            if plain:
                return type(base).generate(
                    base, input_ids=prompts, attention_mask=prompt_mask, generation_config=config, **given
                )
            return model.generate(input_ids=prompts, attention_mask=prompt_mask, generation_config=config, **given)

    eos = int(sample(None, True)[0, prompts.size(1) + 1])  # row 0's second token: row 0 ends there
    seen = []
    hook = base.get_input_embeddings().register_forward_pre_hook(lambda _, a: seen.append(a[0].shape))
    try:
        ours_, plain = sample(eos, False), sample(eos, True)
    finally:
        hook.remove()
    assert torch.equal(ours_, plain)
    completions = plain[:, prompts.size(1) :]
    assert completions[0, 1] == eos and completions.size(1) > 2  # row 0 ended early, another went on
    ours_calls = seen[: len(seen) // 2]  # ours ran first: its prefill, then one call per decode step
    assert min(shape[0] for shape in ours_calls[2:]) < prompts.size(0), ours_calls  # ended rows ran no forward


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_a_trainer_step_with_shared_prompts_trains_as_trls(tmp_path, micro_batches):
    """One optimizer step of the same seed and batch with shared_prompts on and off: the same adapter. With 4
    micro-batches TRL's shuffle scatters the groups, and ours (on) trains the rows regrouped."""
    adapters = []
    for shared in (True, False):
        trainer = make_trainer(
            tmp_path / str(shared), max_steps=1, shared_prompts=shared, max_completion_length=6,
            per_device_train_batch_size=16 // micro_batches, gradient_accumulation_steps=micro_batches,
            reward_funcs=alternating,  # every group a learning signal, whatever the samples
        )  # fmt: skip
        assert trainer._shared_prompts is shared
        trainer.train()
        adapters.append({n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n})
    moved = max((adapters[0][n] - adapters[1][n]).abs().max().item() for n in adapters[0])
    assert moved < 1e-5, moved
    assert any(adapters[0][n].abs().sum() > 0 for n in adapters[0] if "lora_B" in n)  # the step did train


def test_each_micro_batch_trains_whole_groups_on_one_prefill(tmp_path, monkeypatch):
    """4 prompts x 4 completions in 4 micro-batches of 4 rows: TRL shuffles the 16 rows before it cuts them; each
    micro-batch the trainer trains holds one prompt's 4 rows, so its forward prefills one prompt."""
    trainer = make_trainer(
        tmp_path, max_steps=1, max_completion_length=6, per_device_train_batch_size=4, gradient_accumulation_steps=4
    )
    prefills, prefill = [], shared_prompts._prefill

    def spy(model, ids, mask, positions, **kwargs):
        if torch.is_grad_enabled():  # training, not generate
            prefills.append((ids.size(0), shared_prompts.prompt_groups(ids, mask)[0].numel()))
        return prefill(model, ids, mask, positions, **kwargs)

    monkeypatch.setattr(shared_prompts, "_prefill", spy)
    trainer.train()
    assert prefills == [(4, 1)] * 4  # 4 micro-batches, each 4 rows of one prompt
    for batch in trainer._buffered_inputs:
        assert shared_prompts.prompt_groups(batch["prompt_ids"], batch["prompt_mask"])[0].numel() == 1


def test_the_head_runs_in_float32_with_cast_lm_head_to_fp32_as_trls(monkeypatch):
    """``cast_lm_head_to_fp32`` on a bf16 model: TRL's head takes float32 hidden states outside autocast, and so
    does the shared forward (it ran the bf16 states through the head inside autocast, as TRL does without the cast)."""
    from trl.trainer import utils as trl_utils

    from hf_grpo.models.tiny import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=32).to(torch.bfloat16)
    model.config.tie_word_embeddings = False
    model.lm_head = torch.nn.Linear(32, model.config.vocab_size, bias=False).float()  # TRL's cast: a float32 head
    trl_utils.add_fused_lm_head(model, temperature=0.7, cast_lm_head_to_fp32=True, outputs=("log_probs", "entropy"))
    shared_prompts.install(model)
    seen, apply = [], trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *args):
        seen.append((hidden.dtype, torch.is_autocast_enabled("cpu")))
        return apply(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    torch.manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (2, 5)).repeat_interleave(G, 0)  # [2G, P]
    ids, mask = torch.cat([ids, torch.randint(5, 100, (2 * G, C))], 1), torch.ones(2 * G, 5 + C, dtype=torch.long)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref_logps, _ = trl_way(model, ids, mask)
        logps, _ = ours(model, ids, mask)
    assert seen == [(torch.float32, False)] * 2, seen
    assert logps.dtype == ref_logps.dtype == torch.float32
    assert torch.allclose(logps, ref_logps, atol=0.05)  # bf16 backbone: one prefill of 2 prompts against 8 rows


@pytest.mark.parametrize(
    "kwargs",
    [{"num_beams": 3}, {"num_return_sequences": 2, "do_sample": True}, {"num_beams": 2, "num_return_sequences": 2}],
    ids=["beams", "return-sequences", "both"],
)
def test_generate_with_beams_or_several_sequences_per_row_is_hfs(parts, kwargs):
    """A user's ``generation_kwargs`` (or a callback that generates) on the trainer's model, rows repeating a prompt:
    the same tokens as HF generate on whole rows (the prefilled cache had one row per input row: shape errors)."""
    from transformers import GenerationConfig

    model, ids, mask, _ = parts
    model.eval()
    prompts, prompt_mask = ids[:, :-C], mask[:, :-C]
    config = GenerationConfig(max_new_tokens=4, temperature=0.7, top_k=0, pad_token_id=0, eos_token_id=None)
    base, runs = model.get_base_model(), []
    for plain in (True, False):
        torch.manual_seed(3)
        with torch.no_grad():
            generate = functools.partial(type(base).generate, base) if plain else model.generate
            runs.append(generate(input_ids=prompts, attention_mask=prompt_mask, generation_config=config, **kwargs))
    assert torch.equal(runs[0], runs[1])
    assert runs[0].size(0) == prompts.size(0) * kwargs.get("num_return_sequences", 1)
