"""The stand-in server's LoRA adapters: ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` as vLLM answers them.

An adapter is read from ``adapter_config.json`` and ``adapter_model.safetensors`` in ``lora_path`` and merged with PEFT
into a copy of the base model; ``load_inplace`` replaces a loaded name (keeping its id). Refused with vLLM's statuses
and messages: a name already loaded (400), no adapter files (404), LoRA disabled, a rank above ``--max-lora-rank``,
what vLLM's ``PEFTHelper`` refuses (DoRA, ``modules_to_save``, a LoRA bias) and a module that is neither a linear layer
nor an embedding (500); an unknown name on unload (404). ``remerge()`` applies every adapter to new base weights.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import ApiError


logger = logging.getLogger("hf_grpo.vllm_standin.server")


def unsupported_lora_features(config) -> list[str]:
    """What vLLM's adapter loader refuses in an adapter config (``PEFTHelper._validate_features`` and its bias check),
    in vLLM's words; empty when vLLM would load it."""
    checks = (
        (getattr(config, "modules_to_save", None), "vLLM only supports modules_to_save being None."),
        (getattr(config, "use_dora", False), "vLLM does not yet support DoRA."),
        (getattr(config, "bias", "none") != "none", "Adapter bias is not supported."),
    )
    return [problem for refused, problem in checks if refused]


def unexpected_lora_modules(state: dict, expected: set[str]) -> list[str]:
    """The adapter's modules whose last name vLLM does not apply LoRA to (``LoRAModel.check_unexpected_modules``)."""
    modules = {re.sub(r"\.lora_(A|B|embedding_A|embedding_B)(\.[^.]+)?\.weight$", "", key) for key in state}
    return sorted(m.removeprefix("base_model.model.") for m in modules if m.rsplit(".", 1)[-1] not in expected)


@dataclass
class Adapter:
    model: torch.nn.Module  # the base with the adapter merged in
    path: str
    sha256: str  # of adapter_model.safetensors
    lora_int_id: int
    config: Any  # peft.LoraConfig
    state: dict[str, torch.Tensor]
    load_count: int = 1


def read_adapter(config_file: Path, weights_file: Path):
    """The adapter's config and tensors, read from the same bytes that are hashed."""
    from peft import LoraConfig  # peft and safetensors load only when an adapter does
    from safetensors.torch import load as load_safetensors

    data = weights_file.read_bytes()
    config = LoraConfig.from_pretrained(str(config_file.parent))
    return config, load_safetensors(data), hashlib.sha256(data).hexdigest()


class AdapterStore:
    """The loaded adapters by name, each merged into a copy of ``model`` (copied under ``model_lock``)."""

    def __init__(self, model: torch.nn.Module, model_lock, enable_lora: bool, max_lora_rank: int):
        self.model, self.model_lock = model, model_lock
        self.enable_lora, self.max_lora_rank = enable_lora, max_lora_rank
        self.adapters: dict[str, Adapter] = {}
        self.lock = threading.Lock()
        self._lora_ids = itertools.count(1)

    def get(self, name: str) -> Adapter | None:
        with self.lock:
            return self.adapters.get(name)

    def items(self) -> list[tuple[str, Adapter]]:
        with self.lock:
            return list(self.adapters.items())

    def load(self, body: Any) -> str:
        body = body if isinstance(body, dict) else {}
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str):
            raise ApiError(400, "1 validation error: lora_name and lora_path are required strings", "Bad Request")
        if not name or not path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if self.get(name) is not None and not body.get("load_inplace", False):
            raise ApiError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                "in place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        if not self.enable_lora:
            raise ApiError(500, "LoRA is not enabled. Use --enable-lora to enable LoRA.", "InternalServerError")
        config_file, weights_file = Path(path) / "adapter_config.json", Path(path) / "adapter_model.safetensors"
        if not config_file.is_file() or not weights_file.is_file():
            raise ApiError(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        try:
            config, state, digest = read_adapter(config_file, weights_file)
            self._check(name, path, config, state)
            model = self.merge(config, state)
        except ApiError:
            raise
        except Exception as exc:
            raise ApiError(500, f"Loading lora {name} failed: {exc}", "InternalServerError") from exc
        with self.lock:
            old = self.adapters.get(name)
            lora_id, count = (next(self._lora_ids), 1) if old is None else (old.lora_int_id, old.load_count + 1)
            self.adapters[name] = Adapter(model, path, digest, lora_id, config, state, count)
        logger.info("loaded LoRA adapter %s from %s (sha256 %s)", name, path, digest[:12])
        return f"Success: LoRA adapter '{name}' added successfully."

    def _check(self, name: str, path: str, config, state: dict[str, torch.Tensor]) -> None:
        """Refuse what vLLM refuses: a rank above the limit, PEFTHelper's features, modules LoRA does not apply to."""
        if int(config.r) > self.max_lora_rank:
            raise ApiError(
                500, f"LoRA rank {config.r} is greater than max_lora_rank {self.max_lora_rank}.", "InternalServerError"
            )
        unsupported = unsupported_lora_features(config)
        if unsupported:
            raise ApiError(500, f"Loading lora {name} failed: {' '.join(unsupported)}", "InternalServerError")
        # vLLM applies LoRA to the model's linear layers and its embeddings, matched by the module's last name
        expected = {n.rsplit(".", 1)[-1] for n, m in self.model.named_modules() if isinstance(m, torch.nn.Linear)}
        expected |= {"embed_tokens", "lm_head"}
        unexpected = unexpected_lora_modules(state, expected)
        if unexpected:
            raise ValueError(
                f"While loading {path}, expected target modules in {sorted(expected)} but received {unexpected}. "
                "Please verify that the loaded LoRA module is correct"
            )

    def merge(self, config, state: dict[str, torch.Tensor]) -> torch.nn.Module:
        from peft import get_peft_model, set_peft_model_state_dict  # loads only when an adapter does

        with self.model_lock:
            base = copy.deepcopy(self.model)
        peft_model = get_peft_model(base, copy.deepcopy(config))
        result = set_peft_model_state_dict(peft_model, state)
        if result.unexpected_keys:
            raise ValueError(f"unexpected adapter tensors: {result.unexpected_keys[:3]}")
        return peft_model.merge_and_unload().eval()

    def remerge(self) -> None:
        """Merge every adapter again onto the current base weights (vLLM applies adapters to the current base)."""
        for name, adapter in self.items():
            adapter.model = self.merge(adapter.config, adapter.state)
            logger.info("re-merged LoRA adapter %s onto the new base weights", name)

    def unload(self, body: Any) -> str:
        name = body.get("lora_name") if isinstance(body, dict) else None
        if not name:
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        with self.lock:
            if self.adapters.pop(name, None) is None:
                raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        return f"Success: LoRA adapter '{name}' removed successfully."
