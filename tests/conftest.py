"""Shared fixtures (offline hub settings, tiny models built once per session) and the CI tiers.

Markers say what a test needs (``pyproject.toml`` lists them); which CI tier runs it is decided here, in one place,
from those markers, and chosen with ``--tier``:

    python -m pytest              # tier 1, the default: everything not slow, not needing real vLLM or a GPU
    python -m pytest --tier 2     # the slow tests: every recipe in miniature, whole runs, launches, notebooks
    python -m pytest --tier 3     # against real vLLM (python -m hf_grpo.generation.vllm_install first)
    python -m pytest --tier gpu   # on a CUDA machine with vLLM
    python -m pytest --tier all   # everything

``-n 2`` (pytest-xdist, as README's test command runs the tiers) spreads whole files over two worker processes, so a
module's shared run stays in one, and the tests of a module with ``SPREAD_OVER_WORKERS = True`` one by one; each
worker and what it starts then computes on one thread (OMP_NUM_THREADS=1), two busy processes for two cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # one of -n N workers: one thread each, and for the processes it starts
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

TIERS = ("1", "2", "3", "gpu", "all")


def tier_of(item) -> str:
    """The CI tier that runs a test, from what its markers say it needs."""
    if item.get_closest_marker("gpu"):
        return "gpu"
    if item.get_closest_marker("vllm"):
        return "3"
    if item.get_closest_marker("slow") or item.get_closest_marker("miniature"):  # a miniature is a whole run
        return "2"
    return "1"


def pytest_addoption(parser):
    parser.addoption("--tier", choices=TIERS, default="1", help="the CI tier to run (tests/conftest.py says which)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    tier = config.getoption("--tier")
    if tier != "all" and not config.getoption("-m"):  # -m chooses by marker and overrides the tier
        chosen = [item for item in items if tier_of(item) == tier]
        config.hook.pytest_deselected(items=[item for item in items if tier_of(item) != tier])
        items[:] = chosen
    for item in items:  # -n N (--dist loadgroup): a file's tests on one worker, its module fixtures built once ...
        module = getattr(item, "module", None)
        if module is not None and not getattr(module, "SPREAD_OVER_WORKERS", False):  # ... unless it says otherwise
            item.add_marker(pytest.mark.xdist_group(module.__name__))


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory):
    """A warm-started tiny model on disk: the server loads it, the trainer loads it and adds LoRA."""
    from hf_grpo.models.tiny import build_model, build_tokenizer
    from hf_grpo.training.warm_start import warm_start

    tokenizer = build_tokenizer()
    model = build_model(tokenizer, hidden_size=64)
    warm_start(model, tokenizer, steps=60)
    path = tmp_path_factory.mktemp("policy")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random-init tiny model and tokenizer saved to disk (for servers and evaluators that load from a path)."""
    from hf_grpo.training.warm_start import build_tiny

    path = tmp_path_factory.mktemp("tiny-model")
    model, tokenizer = build_tiny(seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
