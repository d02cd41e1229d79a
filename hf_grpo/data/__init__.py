"""Datasets: the embedded arithmetic task and loaders for GSM8K, MATH, MATH-500, OpenMathInstruct-2 and local files."""

from .loaders import DataArguments, format_prompt, load_grpo_datasets


__all__ = ["DataArguments", "format_prompt", "load_grpo_datasets"]
