"""A tiny Qwen2-architecture model and tokenizer built locally.

The embedded default run (``recipes/tiny.yaml``) and the tests need a causal LM that exists without a hub:
``build_tokenizer`` (byte-level BPE, ChatML template) and ``build_model`` (2 layers, about 150k parameters);
``hf_grpo.training.warm_start.build_tiny`` warm-starts them so GRPO sees a reward signal (``python -m
hf_grpo.training.warm_start OUT_DIR`` writes one to ``OUT_DIR``). Why and how: docs/data.md.
"""

from __future__ import annotations

import logging

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from ..data.arithmetic import corpus


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


def tiny_config(vocab_size: int, hidden_size: int = 64, **token_ids) -> Qwen2Config:
    """The tiny model's shape (also what the memory plan reads, before any tokenizer is built)."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=None,
        **token_ids,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0, hidden_size: int = 64) -> Qwen2ForCausalLM:
    """Random-init 2-layer Qwen2 sized for CPU; ``seed`` fixes the weights."""
    config = tiny_config(len(tokenizer), hidden_size, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
