"""Which server a miniature's ``vllm_server`` layout runs on this machine, and what its log says, for the tests that
check it (tests/test_miniatures.py, tests/test_miniature_plan.py).

Real vLLM serves where its CPU build is installed and usable (``find_vllm().runs_on_cpu``, after
``python -m hf_grpo.generation.vllm_install``) and the recipe syncs LoRA adapters; full-weight sync is TRL's NCCL
transfer, which that build cannot receive, so the CPU stand-in serves it, and every layout where vLLM is absent
(``hf_grpo.miniature._swap_generation``). The tests assert whichever serves, so that tier 2 passes with vLLM
installed or not.
"""

from __future__ import annotations

import re

from hf_grpo.generation.vllm_install import SERVER_MODULE, find_vllm


STANDIN = "-m hf_grpo.vllm_standin"
REAL_VLLM = f"-m {SERVER_MODULE} --model"


def serves_real_vllm(use_peft: bool, generation: dict | None) -> bool:
    """Whether real vLLM (not the stand-in) serves a miniature with this ``generation:`` section here."""
    sync = (generation or {}).get("weight_sync", "auto")
    lora = sync == "lora" or (sync == "auto" and bool(use_peft))
    return find_vllm().runs_on_cpu and lora


def serve_command(use_peft: bool, generation: dict | None, model: str) -> str:
    """The server command as the launcher logs it, from the module it runs to the model it serves."""
    return f"{REAL_VLLM if serves_real_vllm(use_peft, generation) else STANDIN} {model}"


def adapters_loaded(server_log: str, real: bool) -> list[str]:
    """The LoRA adapters (``policy-N``) the server's log says it loaded, in order."""
    pattern = r"Loaded new LoRA adapter: name '(policy-\d+)'" if real else r"loaded LoRA adapter (policy-\d+)"
    return re.findall(pattern, server_log)
