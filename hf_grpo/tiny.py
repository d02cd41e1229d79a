"""A tiny Qwen2-architecture model and tokenizer built locally, plus a short supervised warm start.

The embedded default run (``recipes/tiny.yaml``) and the tests need a causal LM that exists without a hub:
``build_tokenizer`` (byte-level BPE, ChatML template), ``build_model`` (2 layers, about 150k parameters),
``warm_start`` (a few hundred supervised steps, so GRPO sees a reward signal) and ``build_tiny``. Why and how:
docs/data.md. Run ``python -m hf_grpo.tiny OUT_DIR`` to write a warm-started model and tokenizer to ``OUT_DIR``.
"""

from __future__ import annotations

import logging
import sys
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from .data.arithmetic import corpus, make_split
from .evaluation.core import prompt_token_ids
from .progress import progress_bar


logger = logging.getLogger(__name__)

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenization (transformers' Qwen2Tokenizer): words, single digits, punctuation, whitespace runs.
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def build_tokenizer(vocab_size: int = 400, seed: int = 0, texts: list[str] | None = None) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on the arithmetic corpus (or on ``texts``); deterministic for a given ``seed``.

    It splits text exactly as Qwen2's tokenizer does (NFC, Qwen2's pre-tokenization regex: one token per digit),
    so ``AutoTokenizer`` loading the saved model directory, which picks ``Qwen2Tokenizer`` for a ``qwen2`` config,
    tokenizes exactly as this object does.
    """
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if texts is None:
        texts = corpus(seed=seed) + ["user\n", "assistant\n"] * 50
    tok.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0, hidden_size: int = 64) -> Qwen2ForCausalLM:
    """Random-init 2-layer Qwen2 sized for CPU; ``seed`` fixes the weights."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def _sft_example(tokenizer, prompt, completion: str) -> tuple[list[int], int]:
    prompt_ids = prompt_token_ids(tokenizer, prompt)
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + completion_ids, len(prompt_ids)


def _sft_batch(batch: list[tuple[list[int], int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 on the prompt and padding), [B, T] each."""
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_token_id)  # [B, T], right-padded
    labels = torch.full((len(batch), width), -100)  # [B, T], -100 = ignored
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)  # [B, T]
    for row, (ids, prompt_len) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def arithmetic_examples(n_problems: int = 4000, seed: int = 0) -> list[tuple[list[dict], str]]:
    """(chat prompt, GSM8K-style answer) pairs of the embedded train split: the default warm-start data."""
    return [([{"role": "user", "content": p["question"]}], p["answer"]) for p in make_split("train", n_problems, seed)]


def warm_start(
    model,
    tokenizer,
    steps: int,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    n_problems: int = 4000,
    examples: list[tuple] | None = None,
    progress: bool | None = None,
) -> list[float]:
    """Supervised steps (loss on completion tokens only). Returns the loss per step.

    ``examples`` are ``(prompt, completion)`` pairs, the prompt a message list or plain text, tokenized as GRPOTrainer
    tokenizes prompts; by default the embedded arithmetic train split in chat form (``arithmetic_examples``).
    A progress bar counts the steps, with the last loss beside it (``progress``: see ``hf_grpo.progress``; None shows
    it on the main process when stderr is a terminal or in a notebook).
    """
    if steps <= 0:
        return []
    pairs = examples if examples is not None else arithmetic_examples(n_problems, seed)
    examples = [_sft_example(tokenizer, prompt, completion) for prompt, completion in pairs]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    start = time.perf_counter()
    with progress_bar(steps, "warm start", enabled=progress, unit="step", leave=False) as bar:
        for _ in range(steps):
            idx = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
            loss = model(**_sft_batch([examples[i] for i in idx], tokenizer.pad_token_id)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)  # drawn by update(), at most every 0.1 s
            bar.update()
    logger.info("warm start: %d steps in %.1fs, final loss %.3f", steps, time.perf_counter() - start, losses[-1])
    model.eval()
    return losses


def build_tiny(seed: int = 0, warm_start_steps: int = 0):
    """Tokenizer and model in one call, optionally warm-started."""
    tokenizer = build_tokenizer(seed=seed)
    model = build_model(tokenizer, seed=seed)
    warm_start(model, tokenizer, warm_start_steps, seed=seed)
    return model, tokenizer


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    out = sys.argv[1] if len(sys.argv) > 1 else "tiny-model"
    model, tokenizer = build_tiny(warm_start_steps=int(sys.argv[2]) if len(sys.argv) > 2 else 300)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    logger.info("wrote %s", out)
