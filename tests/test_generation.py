"""Generation on a vLLM server, tested on CPU against a real HTTP server that speaks vLLM's protocol
(tests/helpers/fake_vllm_server.py): the generation section's layout and commands, adapter sync, seeds, generation
settings on the wire, a flaky server. The launcher is in test_launcher.py, the stand-in's own checks in
test_standin_server.py."""

from __future__ import annotations

import itertools

import pytest
import requests
import torch

from hf_grpo.generation import server_generator
from hf_grpo.generation.server_generator import ServerGenerator
from hf_grpo.generation.settings import GenerationArguments, max_lora_rank, server_command, training_gpus, trl_fields
from hf_grpo.generation.vllm_install import VLLMInstall
from hf_grpo.recipe import RecipeError, load_recipe
from hf_grpo.train import main

from .helpers import reward_scripts
from .helpers.fake_vllm_server import start_in_thread
from .helpers.trainers import make_server_trainer


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
    monkeypatch.setattr(
        "hf_grpo.launch.launcher.find_vllm", lambda: VLLMInstall("vllm", "0.30.0")
    )  # a GPU machine's vLLM
    assert main([f"recipes/{recipe}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = [line.strip() for line in out.splitlines()]
    server = next(line for line in lines if " vllm serve " in f" {line}")
    train = next(line for line in lines if "accelerate launch" in line)
    assert server.startswith(server_part)
    assert train.startswith(train_part) and "--generation.base_url http://127.0.0.1:8000" in train


# ----------------------------------------------------------------------------------------------------------------------
# Training against the fixture server


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


def _as_process(generator: ServerGenerator, process: int) -> ServerGenerator:
    """``generator`` as ``connect`` leaves it on process ``process`` of a trainer with these sampling settings."""
    generator.process_index = process
    generator.sampling = dict(
        max_tokens=8, temperature=1.0, top_p=1.0, top_k=None, min_p=0.0, repetition_penalty=1.0, stop_token_ids=[]
    )
    return generator


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
            runs.append(_as_process(generator, 0).generate(prompts, 4, step=0))
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
            rows[(step, process, round_)], _ = _as_process(generator, process).generate(prompt, 4, step=step)
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
