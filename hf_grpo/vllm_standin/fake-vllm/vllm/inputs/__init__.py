"""vLLM 0.30's prompt shapes accepted by ``LLM.generate`` (``vllm/inputs``): token ids or text."""

from typing import TypedDict


class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: list[int]
    multi_modal_data: dict  # refused by the stand-in (no multimodal models)


class TextPrompt(TypedDict, total=False):
    prompt: str
    multi_modal_data: dict


__all__ = ["TextPrompt", "TokensPrompt"]
