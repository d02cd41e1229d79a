"""Generation on a vLLM server, tested on CPU against a real HTTP server that speaks vLLM's protocol
(tests/helpers/fake_vllm_server.py): adapter sync, layout commands, the launcher, a killed and a flaky server."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch

from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.generation import server_generator
from hf_grpo.generation.layout import GenerationArguments, max_lora_rank, server_command, training_gpus, trl_fields
from hf_grpo.generation.server_generator import ServerGenerator
from hf_grpo.generation.vllm_install import VLLMInstall
from hf_grpo.recipe import RecipeError, load_recipe
from hf_grpo.rewards.functions import gsm8k_correctness
from hf_grpo.train import main
from hf_grpo.trainer import GRPOTrainer

from .helpers import reward_scripts
from .helpers.common import REPO, tiny_config, tiny_lora
from .helpers.fake_vllm_server import start_in_thread, start_subprocess


FIXTURE_SERVE = f"[{sys.executable}, -m, tests.helpers.fake_vllm_server, --model]"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------------------------------------
# Layout


def test_server_command_for_adapter_sync():
    gen = GenerationArguments(
        backend="vllm_server", gpus=[0], port=8123, gpu_memory_utilization=0.85, max_model_len=1536
    )
    cmd, env = server_command(gen, "Qwen/Qwen2.5-Math-1.5B", "lora", lora_r=16, dtype="bfloat16", seed=7)
    assert cmd[:3] == ["vllm", "serve", "Qwen/Qwen2.5-Math-1.5B"]
    text = " ".join(cmd)
    for part in (
        "--host 127.0.0.1",
        "--port 8123",
        "--gpu-memory-utilization 0.85",
        "--max-model-len 1536",
        "--enable-lora",
        "--max-lora-rank 16",
        "--logprobs-mode processed_logprobs",
        "--seed 7",
    ):
        assert part in text
    assert env == {
        "CUDA_VISIBLE_DEVICES": "0",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_LOGGING_LEVEL": "INFO",
    }


def test_server_command_for_full_sync_uses_trl_weight_transfer():
    cmd, env = server_command(GenerationArguments(backend="vllm_server"), "m", "full", 16, None, 0)
    assert "--weight-transfer-config" in cmd and '{"backend": "nccl"}' in cmd and "--enable-lora" not in cmd
    assert env["VLLM_SERVER_DEV_MODE"] == "1"


def test_layout_helpers():
    assert max_lora_rank(4) == 8 and max_lora_rank(16) == 16 and max_lora_rank(33) == 64
    assert training_gpus(GenerationArguments(gpus=[0]), 1) == [1]
    assert training_gpus(GenerationArguments(gpus=[0, 1, 2, 3], data_parallel_size=4), 4) == [4, 5, 6, 7]
    assert training_gpus(GenerationArguments(gpus=[2]), 3) == [0, 1, 3]
    server = GenerationArguments(backend="vllm_server", port=9000)
    assert trl_fields(server, use_peft=True) == {"use_vllm": False}  # our own generator, no vllm on the trainer
    assert trl_fields(server, use_peft=False)["vllm_server_base_url"] == "http://127.0.0.1:9000"
    assert trl_fields(GenerationArguments(backend="vllm_colocate"), True)["vllm_gpu_memory_utilization"] == 0.3
    assert trl_fields(GenerationArguments(), True) == {}


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--generation.backend", "vllm_server", "--generation.weight_sync", "lora", "--use_peft", "false"],
            "needs use_peft",
        ),
        (["--generation.backend", "vllm_server", "--use_vllm", "true"], "generation.backend decides"),
        (["--generation.bakend", "vllm_server"], "did you mean 'backend'"),
        (["--generation.backend", "sglang"], "generation.backend must be one of"),
        (["--generation.backend", "vllm_server", "--generation.gpus", "[0, 1]"], "must list"),
        (["--generation.backend", "vllm_server", "--use_dora", "true"], "use_dora: true: vLLM cannot hot-load DoRA"),
        (
            ["--generation.backend", "vllm_server", "--lora_modules_to_save", "[lm_head]"],
            r"lora_modules_to_save: \['lm_head'\]: vLLM loads adapters only with modules_to_save None",
        ),
        # Retried for server_timeout after the model loaded, instead of refused here
        (["--generation.backend", "vllm_server", "--generation.port", "99999"], "generation.port 99999 is not a TCP"),
        (["--generation.backend", "vllm_server", "--generation.port", "0"], "generation.port 0 is not a TCP"),
        (["--generation.backend", "vllm_server", "--generation.request_timeout", "0"], "request_timeout must be"),
        (["--generation.backend", "vllm_server", "--generation.server_timeout", "nan"], "server_timeout must be"),
        (["--generation.backend", "vllm_server", "--generation.max_retries", "-1"], "max_retries must be 0 or"),
    ],
)
def test_generation_section_errors(args, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(["recipes/tiny.yaml", *args], for_run=False)


@pytest.mark.parametrize(
    "recipe, server_part, train_part",
    [
        (
            "qwen-math-1.5b-math.yaml",
            "CUDA_VISIBLE_DEVICES=0 VLLM_LOGGING_LEVEL=INFO VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen2.5-Math-1.5B",
            "CUDA_VISIBLE_DEVICES=1 accelerate launch",
        ),
        (
            "qwen7b-lora-dedicated.yaml",
            (
                "CUDA_VISIBLE_DEVICES=0,1,2,3 VLLM_LOGGING_LEVEL=INFO VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve "
                "Qwen/Qwen2.5-7B-Instruct"
            ),
            "CUDA_VISIBLE_DEVICES=4,5,6,7 accelerate launch --config_file accelerate_configs/zero2.yaml --num_processes 4",
        ),
    ],
)
def test_dry_run_prints_the_server_and_training_commands(recipe, server_part, train_part, capsys, monkeypatch):
    monkeypatch.setattr("hf_grpo.launch.find_vllm", lambda: VLLMInstall("vllm", "0.30.0"))  # a GPU machine's vLLM
    assert main([f"recipes/{recipe}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = [line.strip() for line in out.splitlines()]
    server = next(line for line in lines if " vllm serve " in f" {line}")
    train = next(line for line in lines if "accelerate launch" in line)
    assert server.startswith(server_part)
    assert train.startswith(train_part) and "--generation.base_url http://127.0.0.1:8000" in train


# ----------------------------------------------------------------------------------------------------------------------
# Training against the fixture server


def make_server_trainer(policy_dir, tmp_path, url, reward=gsm8k_correctness, **overrides):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(policy_dir)
    train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=128, arithmetic_eval_size=8))
    generator = ServerGenerator(url, tmp_path / "adapters", request_timeout=30, max_retries=3, server_timeout=30)
    return GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=tiny_config(tmp_path, **overrides),
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=tiny_lora(),
        generator=generator,
    )


def test_training_through_the_server_syncs_the_adapter_each_step(policy_dir, tmp_path):
    with start_in_thread(
        policy_dir,
        enable_lora=True,
        max_lora_rank=8,
        allow_runtime_lora_updating=True,
        logprobs_mode="processed_logprobs",
    ) as server:
        # a reward that varies in every group, so that every step moves the adapter
        trainer = make_server_trainer(policy_dir, tmp_path, server.url, reward=reward_scripts.alternating)
        checks, sync = [], trainer.generator.sync

        def checked_sync(t):
            synced = sync(t)
            if synced:  # compare what the server serves now with what the trainer just wrote
                served = requests.get(f"{server.url}/fixture/adapters", timeout=10).json()["adapters"]
                checks.append(
                    (
                        t.generator.adapter_name,
                        set(served),
                        served[t.generator.adapter_name]["sha256"],
                        t.generator.adapter_sha256,
                    )
                )
            return synced

        trainer.generator.sync = checked_sync
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        trainer.train()
        stats = requests.get(f"{server.url}/fixture/stats", timeout=10).json()["requests"]
    assert [name for name, *_ in checks] == ["policy-0", "policy-1", "policy-2"]
    for name, served_names, served_sha, trainer_sha in checks:
        assert served_sha == trainer_sha, f"{name}: the server serves another adapter than the trainer's"
        assert served_names == {name}, "the previous adapter should have been unloaded"
    assert len({sha for *_, sha in checks}) == 3, "the adapter should change after every optimizer step"
    assert stats["POST /v1/completions"] == 3 and stats["POST /v1/load_lora_adapter"] == 3
    after = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert any(not torch.equal(before[n], after[n]) for n in before)
    record = trainer.state.log_history[0]
    assert record["time/weight_sync"] > 0 and "sampling/importance_sampling_ratio/mean" in record


def test_adapter_sync_changes_what_the_server_generates(policy_dir, tmp_path):
    with start_in_thread(policy_dir, enable_lora=True, max_lora_rank=8, allow_runtime_lora_updating=True) as server:
        trainer = make_server_trainer(policy_dir, tmp_path, server.url, max_steps=1)
        trainer.generator.sync(trainer)
        prompt = [
            trainer.processing_class.apply_chat_template(
                [{"role": "user", "content": "Tom has 3 pens. Tom gets 4 more. How many pens does Tom have?"}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        ]
        greedy = dict(n=1, max_tokens=10, temperature=0.0)
        first = trainer.generator.client.generate(prompt, model="policy-0", **greedy).completion_ids
        with torch.no_grad():  # move the adapter far, as many optimizer steps would
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.add_(torch.randn_like(p) * 0.5)
        trainer.state.global_step = 1
        trainer.generator.sync(trainer)
        second = trainer.generator.client.generate(prompt, model="policy-1", **greedy).completion_ids
    assert first != second


def served_models(url: str) -> set[str]:
    return {m["id"] for m in requests.get(f"{url}/v1/models", timeout=10).json()["data"]}


def test_an_adapter_another_process_still_generates_with_is_not_unloaded(policy_dir, tmp_path, monkeypatch):
    """Only the main process unloads, and it consulted only its own rounds in flight. Here the other
    rank (its answer to the all-gather faked) still generates with policy-0 when the main process syncs policy-1."""
    with start_in_thread(policy_dir, enable_lora=True, max_lora_rank=8, allow_runtime_lora_updating=True) as server:
        trainer = make_server_trainer(policy_dir, tmp_path, server.url, max_steps=1)
        trainer.generator.sync(trainer)
        monkeypatch.setattr(server_generator, "gather_object", lambda mine: [*mine, ["policy-0"]])
        trainer.state.global_step = 1
        trainer.generator.sync(trainer, in_use=set())  # this process's own rounds have all finished
        assert {"policy-0", "policy-1"} <= served_models(server.url)
        assert (tmp_path / "adapters" / "step-0").is_dir()  # its folder too, to load it again after a restart
        monkeypatch.setattr(server_generator, "gather_object", lambda mine: [*mine, []])
        trainer.state.global_step = 2
        trainer.generator.sync(trainer, in_use=set())  # now no process generates with it: unloaded
        assert "policy-0" not in served_models(server.url) and "policy-2" in served_models(server.url)


def test_adapter_directories_stay_bounded_over_a_50_step_run(policy_dir, tmp_path):
    """One adapter per step used to stay on disk for the whole run; now the last two at most."""
    with start_in_thread(policy_dir, enable_lora=True, max_lora_rank=8, allow_runtime_lora_updating=True) as server:
        trainer = make_server_trainer(
            policy_dir, tmp_path, server.url, reward=reward_scripts.alternating, max_steps=50,
            per_device_train_batch_size=4, max_completion_length=4,
        )  # fmt: skip
        adapters = tmp_path / "adapters"
        (adapters / "step-7").mkdir(parents=True)  # left by an earlier run into the same output_dir
        counts, served, sync = [], [], trainer.generator.sync

        def counted_sync(t):
            synced = sync(t)
            counts.append(len(list(adapters.glob("step-*"))))
            served.append(set(requests.get(f"{server.url}/fixture/adapters", timeout=10).json()["adapters"]))
            return synced

        trainer.generator.sync = counted_sync
        trainer.train()
    assert trainer.state.global_step == 50 and len(counts) == 50
    assert max(counts) <= 2, counts
    assert all(len(names) == 1 for names in served), "the server should serve only the current adapter"
    assert sorted(p.name for p in adapters.iterdir()) == ["step-48", "step-49"]


def _fake_trainer(step: int, process: int):
    from types import SimpleNamespace

    return SimpleNamespace(
        state=SimpleNamespace(global_step=step),
        accelerator=SimpleNamespace(process_index=process),
        max_completion_length=8,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        eos_token_ids=[],
    )


def test_each_prompt_gets_its_own_seed_on_the_wire_and_runs_reproduce(policy_dir, tmp_path, monkeypatch):
    """One seed per request gave the i-th sample of every prompt the same seed + i (vLLM's rule), so
    samples were correlated across prompts. Each prompt is now a request of its own with its own seed range."""
    bodies, send = [], requests.Session.request

    def record(self, method, url, **kwargs):
        if url.endswith("/v1/completions"):
            bodies.append(kwargs["json"])
        return send(self, method, url, **kwargs)

    monkeypatch.setattr(requests.Session, "request", record)
    prompts = [[5, 6, 7, 8]] * 4 + [[9, 10, 11]] * 4  # two groups of 4 on one process
    with start_in_thread(policy_dir) as server:
        runs = []
        for _ in range(2):  # the same seed twice: the same samples
            generator = ServerGenerator(server.url, tmp_path / "adapters", seed=0)
            runs.append(generator.generate(_fake_trainer(0, 0), prompts, 4))
            generator.client.close()
    first = sorted(bodies[:2], key=lambda b: b["seed"])  # sent concurrently: in any order
    assert [b["prompt"] for b in first] == [[[5, 6, 7, 8]], [[9, 10, 11]]] and all(b["n"] == 4 for b in first)
    sample_seeds = [{b["seed"] + i for i in range(4)} for b in first]  # vLLM: sample i draws with seed + i
    assert not sample_seeds[0] & sample_seeds[1], "two prompts' samples share seeds"
    assert sorted(b["seed"] for b in bodies[2:]) == [b["seed"] for b in first]
    assert runs[0] == runs[1]


def test_seeded_requests_never_share_samples_across_processes_rounds_or_steps(policy_dir, tmp_path):
    """Seed = base + 1000 * step + process made process 1's sample j repeat process 0's sample j + 1
    (vLLM seeds sample i with seed + i), and every round of a step repeat the first. Seeds are now spaced apart."""
    from hf_grpo.generation.server_generator import SEED_STRIDE

    with start_in_thread(policy_dir) as server:
        generator = ServerGenerator(server.url, tmp_path / "adapters", seed=0)
        sent, original = [], generator.client.generate
        generator.client.generate = lambda *a, **kw: sent.extend(kw.get("seeds") or []) or original(*a, **kw)
        prompt = [[5, 6, 7, 8]] * 4  # one group of 4 on each process
        rows = {}
        for step, process, round_ in [(0, 0, 0), (0, 1, 0), (0, 0, 1), (0, 1, 1), (1, 0, 0)]:
            rows[(step, process, round_)], _ = generator.generate(_fake_trainer(step, process), prompt, 4)
    assert len(set(sent)) == 5
    spans = sorted(sent)
    assert all(b - a >= SEED_STRIDE for a, b in itertools.pairwise(spans)), "sample seed ranges overlap"
    # what the old scheme produced: process 1's samples equal process 0's, shifted by one
    p0, p1 = rows[(0, 0, 0)], rows[(0, 1, 0)]
    assert p1[:3] != p0[1:], "process 1 repeats process 0's samples"
    assert rows[(0, 0, 1)] != rows[(0, 0, 0)], "a second round of the same step repeats the first"


@pytest.mark.parametrize(
    "mode, dev_mode, warns",
    [
        ("raw_logprobs", True, "runs with --logprobs-mode raw_logprobs"),
        ("processed_logprobs", False, "does not say its --logprobs-mode"),
        ("processed_logprobs", True, None),
    ],
)
def test_a_user_started_server_gets_trls_logprobs_mode_check(policy_dir, tmp_path, caplog, mode, dev_mode, warns):
    """TRL warns when the server's log-probs would bias the importance-sampling correction; our
    generator is set up after TRL's checks, so it runs the same check itself."""
    with (
        start_in_thread(
            policy_dir,
            enable_lora=True,
            max_lora_rank=8,
            allow_runtime_lora_updating=True,
            logprobs_mode=mode,
            dev_mode=dev_mode,
        ) as server,
        caplog.at_level("WARNING", logger="hf_grpo.generation.server_generator"),
    ):
        make_server_trainer(policy_dir, tmp_path, server.url, max_steps=1)
    found = [r.getMessage() for r in caplog.records if "logprobs-mode" in r.getMessage()]
    if warns is None:
        assert not found, found
    else:
        assert any(warns in m for m in found), found


def test_generation_kwargs_and_structured_outputs_reach_the_server(policy_dir, tmp_path):
    """TRL forwards generation_kwargs and vllm_structured_outputs_regex to vLLM; the generator dropped them."""
    with start_in_thread(policy_dir, enable_lora=True, max_lora_rank=8, allow_runtime_lora_updating=True) as server:
        trainer = make_server_trainer(
            policy_dir,
            tmp_path,
            server.url,
            max_steps=1,
            generation_kwargs={"min_tokens": 6},
            max_completion_length=8,
        )
        trainer.train()
        assert trainer.generator.extra_body == {"min_tokens": 6}
        trainer.args.vllm_structured_outputs_regex = "[0-9]+"
        trainer.generator.connect(trainer)
        assert trainer.generator.extra_body["structured_outputs"] == {"regex": "[0-9]+"}
    record = trainer.state.log_history[0]
    assert record["completions/min_length"] >= 6, record  # min_tokens honoured by the server


def test_a_flaky_server_is_retried(policy_dir, tmp_path):
    with start_in_thread(policy_dir, enable_lora=True, max_lora_rank=8, allow_runtime_lora_updating=True) as server:
        requests.post(
            f"{server.url}/fixture/fail", json={"count": 2, "status": 503, "path": "/v1/completions"}, timeout=10
        )
        requests.post(f"{server.url}/fixture/delay", json={"seconds": 0.5, "count": 2}, timeout=10)
        trainer = make_server_trainer(policy_dir, tmp_path, server.url, max_steps=2)
        trainer.generator.client.backoff = 0.1
        trainer.train()
        stats = requests.get(f"{server.url}/fixture/stats", timeout=10).json()["requests"]
    assert trainer.state.global_step == 2
    assert stats["POST /v1/completions"] == 2 + 2  # two injected 503s, then one success per step


# ----------------------------------------------------------------------------------------------------------------------
# End to end: the command line, the launcher and a server that dies


def run_train(*args, timeout=600, **popen):
    return subprocess.run(
        [sys.executable, "-m", "hf_grpo.train", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **popen,
    )


COMMON = [
    "recipes/tiny.yaml",
    "--warm_start_steps",
    "0",
    "--per_device_train_batch_size",
    "16",
    "--num_generations",
    "4",
    "--max_completion_length",
    "10",
    "--arithmetic_train_size",
    "64",
    "--arithmetic_eval_size",
    "8",
    "--logging_steps",
    "1",
    "--lora_r",
    "8",
    "--lora_alpha",
    "16",
]


def test_launcher_finds_programs_beside_python_or_names_the_missing_one(monkeypatch):
    from hf_grpo.launch import ProgramNotFound, resolve_program

    monkeypatch.setenv("PATH", "/nonexistent")  # a venv used as .venv/bin/python without activating it
    resolved = resolve_program(["accelerate", "launch", "-m", "hf_grpo.train"])
    assert resolved[0] == str(Path(sys.executable).parent / "accelerate") and resolved[1:] == [
        "launch",
        "-m",
        "hf_grpo.train",
    ]
    with pytest.raises(ProgramNotFound, match=r"`vllm` is not on PATH.*pip install -e '\.\[vllm\]'"):
        resolve_program(["vllm", "serve", "Qwen/Qwen2.5-Math-1.5B"])


@pytest.mark.subprocess
@pytest.mark.slow  # ~40 s, the slowest of tier 1: a whole launch (server, training, stop)
def test_launcher_starts_the_server_trains_and_stops_it(policy_dir, tmp_path):
    port, out = free_port(), tmp_path / "launched"
    result = run_train(
        *COMMON,
        "--model_name_or_path",
        str(policy_dir),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--generation.backend",
        "vllm_server",
        "--generation.port",
        str(port),
        "--generation.serve_command",
        FIXTURE_SERVE,
        "--generation.server_timeout",
        "120",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "vLLM server healthy at http://127.0.0.1:" in result.stderr
    assert (out / "adapter_model.safetensors").is_file() and (out / "vllm_server.log").is_file()
    log = (out / "vllm_server.log").read_text()
    assert "--gpu-memory-utilization" in log and "vllm_adapters/step-1" in log  # our flags reached it; LoRA synced
    with pytest.raises(requests.ConnectionError):  # stopped when training ended
        requests.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_a_killed_server_ends_the_run_with_a_clear_error(policy_dir, tmp_path):
    server = start_subprocess(policy_dir, enable_lora=True, max_lora_rank=8)
    out = tmp_path / "killed"
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hf_grpo.train",
                *COMMON,
                "--model_name_or_path",
                str(policy_dir),
                "--output_dir",
                str(out),
                "--max_steps",
                "500",
                "--generation.backend",
                "vllm_server",
                "--generation.base_url",
                server.url,
                "--generation.request_timeout",
                "5",
                "--generation.max_retries",
                "1",
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 300
        history = out / "training_history.json"
        while time.monotonic() < deadline:  # let it train a couple of steps
            if history.exists() and len(json.loads(history.read_text() or "[]")) >= 2:
                break
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.5)
        server.kill()
        killed = time.monotonic()
        _, stderr = proc.communicate(timeout=120)
        ended = time.monotonic() - killed
    finally:
        server.stop()
    assert proc.returncode not in (0, None)
    assert ended < 60, f"the run took {ended:.0f} s to stop after the server died"
    assert server.url in stderr and "vllm serve" in stderr


RUN_MARK = "HF_GRPO_TEST_RUN_MARK"


def marked_processes(mark: str) -> dict[int, str]:
    """Live processes (not zombies) whose environment carries ``RUN_MARK=mark``: pid -> command line."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"{RUN_MARK}={mark}".encode() not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def kill_marked(mark: str) -> None:
    """SIGKILL whatever a test's run left behind (cleanup; the assertions are the test's)."""
    for pid in marked_processes(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_until(condition, timeout: float, interval: float = 0.2) -> bool:
    """Poll ``condition()`` until it holds or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(interval)
    return bool(condition())


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow  # 40 s: a whole launch
def test_a_signalled_launcher_leaves_no_process_behind_and_the_run_resumes(policy_dir, tmp_path):
    """The launcher, its vLLM server, accelerate and both training workers all end on SIGTERM of the
    launcher while training runs (after a checkpoint); the same command with resume auto then continues. (SIGINT
    takes the launcher's same path: test_failure_messages.py's Ctrl-C test sends it to a 2-process launch.)"""
    signum = signal.SIGTERM
    mark = f"{os.getpid()}-{signum}-{time.monotonic_ns()}"
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "hf_grpo.train", *COMMON,
        "--model_name_or_path", str(policy_dir), "--output_dir", str(out), "--save_strategy", "steps",
        "--save_steps", "2", "--num_processes", "2", "--generation.backend", "vllm_server",
        "--generation.serve_command", FIXTURE_SERVE, "--generation.server_timeout", "120",
        "--eval_before_after", "false",
    ]  # fmt: skip
    launcher = subprocess.Popen(
        [*command, "--max_steps", "500", "--generation.port", str(free_port())],
        cwd=REPO, env={**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # a complete checkpoint, then training is under way past it
            commands = list(marked_processes(mark).values())
            started = (
                sum("vllm_server" in c for c in commands) >= 1 and sum("hf_grpo.train" in c for c in commands) >= 4
            )
            if started and any((c / "trainer_state.json").is_file() for c in out.glob("checkpoint-*")):
                break
            assert launcher.poll() is None, launcher.stderr.read()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail(f"the run did not reach a checkpoint: {marked_processes(mark)}")
        time.sleep(1)
        launcher.send_signal(signum)
        launcher.wait(timeout=120)
        assert wait_until(lambda: not marked_processes(mark), 15), marked_processes(mark)
        steps = sorted(
            int(c.name.split("-")[1]) for c in out.glob("checkpoint-*") if (c / "trainer_state.json").is_file()
        )
        resumed = subprocess.run(
            [*command, "--max_steps", str(steps[-1] + 2), "--generation.port", str(free_port()),
             "--resume_from_checkpoint", "auto"],
            cwd=REPO, env={**os.environ, RUN_MARK: mark, "OMP_NUM_THREADS": "1"},
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        history = json.loads((out / "training_history.json").read_text())
        assert max(r["step"] for r in history if "reward" in r) == steps[-1] + 2
    finally:
        kill_marked(mark)
        if launcher.poll() is None:
            launcher.kill()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_workers_that_ignore_the_stop_signal_are_killed_with_the_launch(signum):
    """After the grace period the launcher killed only `accelerate launch`, orphaning its workers."""
    mark = f"stubborn-{os.getpid()}-{signum}-{time.monotonic_ns()}"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tests.scripts.stubborn_launch"],
        cwd=REPO,
        env={**os.environ, RUN_MARK: mark},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout.readline().strip() == "launched"
        # launcher, its watchdog, launch, worker
        assert wait_until(lambda: len(marked_processes(mark)) == 4, 120), marked_processes(mark)
        launcher.send_signal(signum)
        # The launcher's stop is bounded by its code (2 s grace, SIGKILL, the watchdog told to exit), not by a number
        # of seconds on a loaded machine: this wait only catches a hang (it failed once at 30 s under load ~4.5).
        assert launcher.wait(timeout=300) == 130
        # its groups were SIGKILLed before it returned: only the kernel's reaping is left
        assert wait_until(lambda: not marked_processes(mark), 60), marked_processes(mark)
    finally:
        kill_marked(mark)
        if launcher.poll() is None:
            launcher.kill()


def test_a_sigkilled_launcher_leaves_no_process_behind(tmp_path):
    """A SIGKILLed launcher stops nothing itself; its watchdog stops the server's and the training launch's
    process groups, SIGKILLing the workers that ignore SIGTERM after its grace period."""
    mark = f"sigkilled-{os.getpid()}-{time.monotonic_ns()}"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tests.scripts.stubborn_launch", "--server", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, RUN_MARK: mark},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout.readline().strip() == "launched"
        # launcher, server, engine worker, launch, worker (and, with its watchdog, one more)
        assert wait_until(
            lambda: sum("hf_grpo.watchdog" not in c for c in marked_processes(mark).values()) == 5, 30
        ), marked_processes(mark)
        launcher.kill()
        launcher.wait()
        assert wait_until(lambda: not marked_processes(mark), 15), marked_processes(mark)
        assert "hf_grpo watchdog: the launcher died" in launcher.stderr.read()
    finally:
        kill_marked(mark)
        if launcher.poll() is None:
            launcher.kill()


def test_a_launch_that_ends_dismisses_its_watchdog(tmp_path):
    """The launcher stops its groups itself, then its watchdog exits without signalling anything."""
    mark = f"finished-{os.getpid()}-{time.monotonic_ns()}"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tests.scripts.stubborn_launch", "--server", str(tmp_path), "--finish"],
            cwd=REPO,
            env={**os.environ, RUN_MARK: mark},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert not [c for c in marked_processes(mark).values() if "hf_grpo.watchdog" in c]
        assert "hf_grpo watchdog" not in result.stderr
        assert wait_until(lambda: not marked_processes(mark), 10), marked_processes(mark)
    finally:
        kill_marked(mark)


@pytest.mark.parametrize("end", ["done", "eof"])
def test_the_watchdog_stops_its_groups_only_when_the_launcher_dies(end):
    """``done`` dismisses the watchdog, leaving the groups alone; end of file without it stops them all (SIGKILL for
    a group that ignores SIGTERM)."""
    from hf_grpo.watchdog import Watchdog

    ignores_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
    )
    groups = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
        for code in ("import time; print(flush=True); time.sleep(600)", ignores_term)
    ]
    watchdog = Watchdog(grace_s=1.0)
    try:
        for group in groups:
            group.stdout.readline()  # started, SIGTERM handler set
            watchdog.watch(group.pid)
        if end == "done":
            watchdog.dismiss()
            time.sleep(1.5)
            assert [group.poll() for group in groups] == [None, None]
        else:
            watchdog.process.stdin.close()
            assert watchdog.process.wait(timeout=10) == 0
            assert [group.wait(timeout=1) for group in groups] == [-signal.SIGTERM, -signal.SIGKILL]
    finally:
        for group in groups:
            group.kill()
            group.communicate()
        if watchdog.process.poll() is None:
            watchdog.process.kill()


def test_stopping_the_server_stops_its_engine_workers_too(tmp_path):
    """Stopping the server waited for the group leader only; an engine worker that outlives it (here one
    that ignores SIGTERM) was left running, holding its GPU."""
    from hf_grpo.generation.server import VLLMServerProcess

    mark = f"server-{os.getpid()}-{time.monotonic_ns()}"
    worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    leader = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); time.sleep(600)"
    server = VLLMServerProcess(
        [sys.executable, "-c", leader], {RUN_MARK: mark}, "http://127.0.0.1:9", tmp_path / "server.log", 10
    )
    server.start()
    try:
        assert wait_until(lambda: len(marked_processes(mark)) == 2, 30), marked_processes(mark)
        server.stop(grace_s=5)
        assert wait_until(lambda: not marked_processes(mark), 10), marked_processes(mark)
    finally:
        kill_marked(mark)


def save_adapter(policy_dir, path, **lora) -> None:
    """A rank-8 q_proj/v_proj PEFT adapter of the policy (with ``lora``'s LoraConfig settings) saved at ``path``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], **lora)
    get_peft_model(AutoModelForCausalLM.from_pretrained(policy_dir), config).save_pretrained(path)


def load_into_standin(policy_dir, path):
    """(answer to /v1/load_lora_adapter for ``path``, the adapters the stand-in then serves)."""
    with start_in_thread(policy_dir, enable_lora=True, max_lora_rank=8, allow_runtime_lora_updating=True) as server:
        answer = requests.post(
            f"{server.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(path)}, timeout=60
        )
        served = requests.get(f"{server.url}/fixture/adapters", timeout=10).json()["adapters"]
    return answer, served


@pytest.mark.parametrize(
    "lora, refusal",
    [
        ({"use_dora": True}, "vLLM does not yet support DoRA."),
        ({"modules_to_save": ["lm_head"]}, "vLLM only supports modules_to_save being None."),
        ({"bias": "lora_only"}, "Adapter bias is not supported."),
    ],
    ids=["dora", "modules_to_save", "bias"],
)
def test_the_standin_server_refuses_adapters_vllm_refuses(policy_dir, tmp_path, lora, refusal):
    """The stand-in loaded adapters that vLLM 0.22-0.31's PEFTHelper refuses."""
    save_adapter(policy_dir, tmp_path / "adapter", **lora)
    answer, served = load_into_standin(policy_dir, tmp_path / "adapter")
    assert answer.status_code == 500 and refusal in answer.text, answer.text
    assert served == {}


def test_the_standin_server_refuses_adapter_modules_vllm_does_not_apply_lora_to(policy_dir, tmp_path):
    """vLLM matches each adapter module's last name against the model's LoRA-able layers (linear
    layers and embeddings) and refuses the adapter otherwise (a vision tower's LoRA, say); the stand-in merged it."""
    from safetensors.torch import load_file, save_file

    save_adapter(policy_dir, tmp_path / "adapter")
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    state = load_file(weights)
    a = next(k for k in state if k.endswith("q_proj.lora_A.weight"))
    state["base_model.model.visual.blocks.0.attn.proj.lora_A.weight"] = state[a].clone()
    save_file(state, weights)
    answer, served = load_into_standin(policy_dir, tmp_path / "adapter")
    assert answer.status_code == 500, answer.text
    assert "expected target modules in" in answer.text and "but received ['visual.blocks.0.attn.proj']" in answer.text
    assert "q_proj" in answer.text and served == {}


def test_the_standin_command_line_serves_bf16_numerics(policy_dir):
    """The bf16 mode was reachable only in-process; ``--numerics bfloat16`` gives it to a launched
    server (``generation.extra_args``). Its greedy log-probs then move off the fp32 server's."""

    def prompt_logprobs(*extra):
        server = start_subprocess(policy_dir, enable_lora=False, extra_args=list(extra))
        try:
            prompts = [f"{a} + {b} =" for a, b in ((12, 30), (7, 5), (48, 51), (3, 99))]
            body = {"model": str(policy_dir.resolve()), "prompt": prompts, "max_tokens": 1, "temperature": 0}
            answer = requests.post(f"{server.url}/v1/completions", json={**body, "logprobs": 0}, timeout=60)
            assert answer.status_code == 200, answer.text
            return torch.tensor([c["logprobs"]["token_logprobs"][0] for c in answer.json()["choices"]])
        finally:
            server.stop()

    fp32, bf16 = prompt_logprobs(), prompt_logprobs("--numerics", "bfloat16")
    assert fp32.shape == bf16.shape and (fp32 - bf16).abs().max() > 1e-4


@pytest.mark.parametrize("numerics", ["float32", "bfloat16"])
def test_importance_sampling_correction_engages_against_bf16_numerics(policy_dir, tmp_path, numerics):
    """With fp32 weights the stand-in returns the trainer's own log-probs, so TRL's importance-sampling
    correction was never exercised. A bf16 stand-in differs from the trainer as a bf16 vLLM does: the sampler/trainer
    log-prob gap and the correction ratio then move off 0 and 1."""
    with start_in_thread(
        policy_dir,
        enable_lora=True,
        max_lora_rank=8,
        allow_runtime_lora_updating=True,
        logprobs_mode="processed_logprobs",
        numerics=numerics,
    ) as server:
        trainer = make_server_trainer(policy_dir, tmp_path, server.url, max_steps=1)
        trainer.train()
    record = trainer.state.log_history[0]
    gap = record["sampling/sampling_logp_difference/mean"]
    ratio_min = record["sampling/importance_sampling_ratio/min"]
    if numerics == "float32":
        assert gap < 1e-4 and ratio_min > 0.999, record
    else:
        assert gap > 1e-3 and ratio_min < 0.999, record


def test_a_server_already_on_the_port_is_not_taken_for_ours(policy_dir, tmp_path):
    """A leftover server answering /health on the port passed for the one being started."""
    from hf_grpo.generation.server import ServerStartError, VLLMServerProcess

    with start_in_thread(policy_dir) as leftover:
        slow = [sys.executable, "-c", "import time; time.sleep(60)"]  # ours, still loading its model
        server = VLLMServerProcess(slow, {}, leftover.url, tmp_path / "server.log", timeout_s=30)
        start = time.monotonic()
        with pytest.raises(ServerStartError, match=r"already accepts connections .* set generation.port"):
            server.__enter__()
        assert time.monotonic() - start < 10 and server.process is None  # refused before starting anything
