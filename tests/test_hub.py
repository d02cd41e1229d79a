"""Pushing a run to the Hub, offline: a real tiny run goes to a local HTTP server that speaks the Hub API subset
huggingface_hub uses (tests/helpers/fake_hub.py), reached through HF_ENDPOINT exactly as the real Hub would be.
The card's metadata alone (no push) is in test_hub_card.py; a push refused before anything is sent, and a Hub that does
not answer, in test_hub_refusals.py."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import platform
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from huggingface_hub import ModelCard, constants
from safetensors.torch import load_file, save_file

from hf_grpo.base import run_files
from hf_grpo.publish import hub
from hf_grpo.publish.summary import eval_table
from hf_grpo.train import main as train_main

from .helpers.common import run_module
from .helpers.fake_hub import start_fake_hub


TOKEN = "hf_testtoken123" + "4567890abcdefghijklmnopqrs"  # shaped like a real user token: hf_ + 38 letters/digits
REPO = "tester/tiny-grpo"
RUN_FILES = {
    "README.md",
    "adapter_config.json",
    "adapter_model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "recipe.yaml",
    "eval_results.json",
    "training_history.json",
    "training_curves.png",
    "summary.md",
    "versions.json",  # written by the training run: the card's versions are the ones it trained with
    "eval_before.jsonl",  # per-problem held-out records
    "eval_after.jsonl",
}
REWRITTEN = {"recipe.yaml", "adapter_config.json"}  # they name local paths (output_dir, the tiny base model's folder)
# An absolute path of two components or more (/tmp/x, /root/y, C:/Users/z), or one under ~, not inside a URL.
ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])(?:(?:[A-Za-z]:)?(?:/[\w.@+-]+){2,}|~/[\w.@+-]+)")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished tiny run with checkpoints, plus the vllm_adapters/ folder a server-mode run leaves."""
    out = tmp_path_factory.mktemp("hub") / "run"
    args = {
        "output_dir": out,
        "max_steps": 4,
        "warm_start_steps": 10,
        "tiny_hidden_size": 64,
        "arithmetic_eval_size": 8,
        "arithmetic_train_size": 64,
        "per_device_train_batch_size": 32,
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": 2,
    }
    assert train_main(["recipes/tiny.yaml", *(x for k, v in args.items() for x in (f"--{k}", str(v)))]) == 0
    adapters = out / "vllm_adapters" / "step-4"
    adapters.mkdir(parents=True)
    shutil.copy(out / "adapter_config.json", adapters)
    shutil.copy(out / "adapter_model.safetensors", adapters)
    assert any(p.name.startswith("checkpoint-") for p in out.iterdir())
    return out


@pytest.fixture
def fake_hub(monkeypatch):
    """The fake Hub, with HF_ENDPOINT and HF_TOKEN pointing at it for in-process pushes.

    huggingface_hub's import-time ``constants.ENDPOINT`` is pointed at a second, decoy server: anything sent there
    (push not reading HF_ENDPOINT at call time, or a stray call of the client) shows up in ``decoy.requests``.
    """
    with start_fake_hub(token=TOKEN) as server, start_fake_hub() as decoy:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # conftest sets HF_HUB_OFFLINE=1 for everything else
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
        monkeypatch.setattr(constants, "ENDPOINT", decoy.url)
        server.decoy = decoy
        yield server
        assert decoy.requests == [], [r.path for r in decoy.requests]
        assert server.unhandled == []


def _leaks(text_or_bytes) -> bool:
    data = text_or_bytes.encode() if isinstance(text_or_bytes, str) else text_or_bytes
    return TOKEN.encode() in data


# ---------------------------------------------------------------------------------------------------------------------
# (a) what is uploaded


def test_push_uploads_the_run_and_nothing_else(run_dir, fake_hub):
    result = hub.push(run_dir, REPO)
    files = fake_hub.files(REPO)
    assert set(files) == RUN_FILES
    for name in RUN_FILES - {"README.md"} - REWRITTEN:
        assert files[name] == (run_dir / name).read_bytes(), name
    for name in REWRITTEN:  # the same content, local paths aside
        assert files[name] != (run_dir / name).read_bytes() and str(run_dir).encode() in (run_dir / name).read_bytes()
    assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] == "base_model"
    assert yaml.safe_load(files["recipe.yaml"]) == {
        **yaml.safe_load((run_dir / "recipe.yaml").read_text()),
        "output_dir": "run",
    }
    assert not any(name.startswith(("checkpoint-", "base_model", "vllm_adapters")) for name in files)
    assert not any(name.endswith((".bin", ".pt", ".pth", ".pkl", ".pickle")) for name in files)
    assert {"base_model/", "vllm_adapters/", "training_args.bin", "checkpoint-2/", "checkpoint-4/"} <= set(
        result.left_out
    )
    assert result.repo_id == REPO and result.repo_url == f"{fake_hub.url}/{REPO}" and result.revision == "main"
    assert fake_hub.repos[REPO].visibility == "private"
    calls = [(r.method, r.path) for r in fake_hub.requests]
    assert calls == [
        ("POST", "/api/repos/create"),
        ("POST", "/api/validate-yaml"),
        ("POST", f"/api/models/{REPO}/preupload/main"),
        ("POST", f"/api/models/{REPO}/commit/main"),
    ]
    (commit,) = fake_hub.commits
    assert commit["summary"] == hub.DEFAULT_COMMIT_MESSAGE and commit["paths"] == sorted(RUN_FILES)

    # pushing again to the existing repo works (create_repo answers 409, exist_ok swallows it)
    hub.push(run_dir, REPO, commit_message="second push")
    assert [c["summary"] for c in fake_hub.commits] == [hub.DEFAULT_COMMIT_MESSAGE, "second push"]


# ---------------------------------------------------------------------------------------------------------------------
# (b) the model card


def test_card_holds_results_versions_and_recipe(run_dir, fake_hub):
    hub.push(run_dir, REPO)
    card = fake_hub.files(REPO)["README.md"].decode()
    results = json.loads((run_dir / "eval_results.json").read_text())

    assert card.startswith("---\n")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "peft"
    assert meta["tags"] == ["trl", "grpo", "hf_grpo", "math"]
    assert "base_model" not in meta  # the tiny base is a local path
    assert "datasets" not in meta  # the embedded arithmetic set is not on the Hub

    assert eval_table(results) in card
    before, after = results["before"], results["after"]
    assert f"| accuracy | {before['accuracy']:.1%} | {after['accuracy']:.1%} |" in card
    assert f"| correct | {before['correct']} (" in card and f"| held-out problems | {before['total']} |" in card

    assert f"| python | {platform.python_version()} |" in card
    for lib in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "hf_grpo"):
        assert f"| {lib} | {importlib.metadata.version(lib)} |" in card, lib

    recipe = fake_hub.files(REPO)["recipe.yaml"].decode().rstrip("\n")  # as uploaded
    assert f"```yaml\n{recipe}\n```" in card
    assert "![training curves](training_curves.png)" in card
    assert f'PeftModel.from_pretrained(base, "{REPO}")' in card
    assert "`gsm8k_correctness`" in card and "| loss | `dapo` |" in card and "| KL coefficient (beta) | `0` |" in card


# ---------------------------------------------------------------------------------------------------------------------
# (c) the token: only in the Authorization header


def _assert_token_only_in_auth_header(server):
    assert server.requests
    for request in server.requests:
        assert request.headers.get("authorization") == f"Bearer {TOKEN}", request.path
        for name, value in request.headers.items():
            assert name == "authorization" or not _leaks(value), (request.path, name)
        assert not _leaks(request.body), request.path
    for upload in server.uploads:
        assert not _leaks(upload.content), upload.path


def test_token_only_in_authorization_header(run_dir, fake_hub, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    for name in ("huggingface_hub", "httpx", "httpx2", "hf_grpo"):
        caplog.set_level(logging.DEBUG, logger=name)
    hub.push(run_dir, REPO)
    _assert_token_only_in_auth_header(fake_hub)
    assert fake_hub.uploads
    assert "(authenticated: True)" in caplog.text and not _leaks(caplog.text)  # the client did log its requests
    captured = capfd.readouterr()
    assert not _leaks(captured.out) and not _leaks(captured.err)


def test_cli_push_in_a_subprocess(run_dir):
    with start_fake_hub(token=TOKEN) as server:
        env = {"HF_ENDPOINT": server.url, "HF_TOKEN": TOKEN, "HF_HUB_OFFLINE": "0"}
        result = run_module(
            "hf_grpo.publish.hub",
            str(run_dir),
            "tester/cli-run",
            "--public",
            "--revision",
            "dev",
            env=env,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert not _leaks(result.stdout) and not _leaks(result.stderr)
        assert f"{server.url}/tester/cli-run" in result.stdout
        for name in RUN_FILES:
            assert f"  {name}\n" in result.stdout, name
        assert "left out:" in result.stdout and "base_model/" in result.stdout
        assert set(server.files("tester/cli-run", "dev")) == RUN_FILES
        assert server.files("tester/cli-run", "main") == {}  # the branch was created, main left alone
        assert server.repos["tester/cli-run"].visibility == "public"
        _assert_token_only_in_auth_header(server)
        assert server.unhandled == []


# ---------------------------------------------------------------------------------------------------------------------
# (d) refusing to push a token


def _plant(run_copy, case):
    if case == "token in summary.md":
        with open(run_copy / "summary.md", "a") as f:
            f.write(f"\nlogin with {TOKEN}\n")
        return "summary.md"
    if case == "token-shaped string in recipe.yaml":
        with open(run_copy / "recipe.yaml", "a") as f:
            f.write("# hub_token: hf_" + "Ab1" * 12 + "\n")
        return "recipe.yaml"
    if case == "token in eval_after.jsonl":  # a completion that happened to print it
        with open(run_copy / "eval_after.jsonl", "a") as f:
            f.write(json.dumps({"index": 99, "completion": TOKEN, "grade": "wrong"}) + "\n")
        return "eval_after.jsonl"
    if case == "token in safetensors metadata":
        path = run_copy / "adapter_model.safetensors"
        save_file(load_file(path), path, metadata={"format": "pt", "note": TOKEN})
        return "adapter_model.safetensors"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "token in summary.md",
        "token-shaped string in recipe.yaml",
        "token in eval_after.jsonl",
        "token in safetensors metadata",
    ],
)
def test_refuses_to_push_a_file_holding_a_token(run_dir, tmp_path, fake_hub, case, capsys):
    run_copy = tmp_path / "run"
    shutil.copytree(run_dir, run_copy, ignore=shutil.ignore_patterns("checkpoint-*", "vllm_adapters"))
    culprit = _plant(run_copy, case)

    with pytest.raises(hub.HubUsageError) as info:
        hub.push(run_copy, REPO)
    message = str(info.value)
    assert culprit in message and "refusing to push" in message
    assert not _leaks(message) and "Ab1Ab1" not in message
    assert fake_hub.requests == []  # refused before anything was sent

    assert hub.main([str(run_copy), REPO]) == 2
    err = capsys.readouterr().err
    assert culprit in err and not _leaks(err)
    assert fake_hub.requests == []


# ---------------------------------------------------------------------------------------------------------------------
# (e) merged weights


def test_merged_push_uploads_base_plus_lora(run_dir, tmp_path, fake_hub):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    result = hub.push(run_dir, REPO, merged=True)
    files = fake_hub.files(REPO)
    assert "model.safetensors" in files and "config.json" in files
    assert not any(name.startswith("adapter_") for name in files)
    assert set(files) == (RUN_FILES - {"adapter_config.json", "adapter_model.safetensors"}) | {
        "model.safetensors",
        "config.json",
        "generation_config.json",
    }
    assert result.merged and "adapter_model.safetensors" in result.left_out
    meta = yaml.safe_load(files["README.md"].decode().split("---\n")[1])
    assert meta["library_name"] == "transformers"
    for upload in fake_hub.uploads:  # the merged config.json included
        text = _text_of(upload.path, upload.content)
        assert text is None or _local_paths_in(text, run_dir) == [], upload.path

    pulled = tmp_path / "pulled"
    pulled.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (pulled / name).write_bytes(files[name])
    merged = AutoModelForCausalLM.from_pretrained(pulled).eval()
    base = AutoModelForCausalLM.from_pretrained(run_dir / "base_model").eval()
    with torch.no_grad():
        ids = torch.randint(3, merged.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
        base_logits = base(ids).logits
        reference = PeftModel.from_pretrained(base, run_dir).eval()
        expected = reference(ids).logits
        got = merged(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert (got - base_logits).abs().max() > 1e-3  # the adapter did change the model


# ---------------------------------------------------------------------------------------------------------------------
# (f) user errors and Hub errors on the command line


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing output dir", "does not exist"),
        ("empty output dir", "is not a run of hf_grpo"),
        ("bad timeout", "HF_GRPO_HUB_TIMEOUT='soon' is not a number of seconds above 0"),
        ("huge timeout", "HF_GRPO_HUB_TIMEOUT='1e10' is not a number of seconds above 0 and at most 86400"),
        ("no token", "export HF_TOKEN"),
        ("offline", "HF_HUB_OFFLINE"),
        ("bad repo id", "invalid repo id"),
        ("merged without adapter", "drop --merged"),
    ],
)
def test_cli_user_errors_exit_2(run_dir, tmp_path, fake_hub, monkeypatch, capsys, case, expected):
    target, repo, extra = str(run_dir), REPO, []
    if case == "missing output dir":
        target = str(tmp_path / "nope")
    elif case == "empty output dir":
        target = str(tmp_path)
    elif case in ("bad timeout", "huge timeout"):  # 1e10 s ended in an OverflowError traceback
        monkeypatch.setenv("HF_GRPO_HUB_TIMEOUT", "soon" if case == "bad timeout" else "1e10")
    elif case == "no token":
        monkeypatch.delenv("HF_TOKEN")
    elif case == "offline":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    elif case == "bad repo id":
        repo = "a/b/c"
    elif case == "merged without adapter":  # a run of full model weights
        target, extra = str(run_files.claim(tmp_path / "full")), ["--merged"]
        for name in ("config.json", "model.safetensors"):
            shutil.copy(run_dir / "base_model" / name, target)
    assert hub.main([target, repo, *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("python -m hf_grpo.publish.hub: error: ") and expected in captured.err
    assert captured.err.count("\n") == 1  # one line
    assert "Traceback" not in captured.err and not _leaks(captured.err)
    assert fake_hub.requests == []


@pytest.mark.slow  # a subprocess; test_cli_user_errors_exit_2's no-token case checks the same message in-process
def test_cli_without_token_in_a_subprocess(run_dir):
    env = {"HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": "", "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}
    result = run_module("hf_grpo.publish.hub", str(run_dir), REPO, env=env, timeout=60)
    assert result.returncode == 2
    assert "export HF_TOKEN" in result.stderr and "Traceback" not in result.stderr


def test_hub_refusal_exits_1_without_the_token(run_dir, fake_hub, monkeypatch, capsys):
    wrong = "hf_wrongtoken" + "0123456789abcdefghijklmnopqrstu"
    monkeypatch.setenv("HF_TOKEN", wrong)
    with pytest.raises(hub.HubPushError) as info:
        hub.push(run_dir, REPO)
    assert "401" in str(info.value) and wrong not in str(info.value)
    assert hub.main([str(run_dir), REPO]) == 1
    err = capsys.readouterr().err
    assert "401" in err and wrong not in err and not _leaks(err)
    assert all(r.headers["authorization"] == f"Bearer {wrong}" for r in fake_hub.requests)
    assert fake_hub.uploads == []


def test_bare_repo_name_lands_in_the_token_owners_namespace(run_dir, fake_hub):
    result = hub.push(run_dir, "bare-name")
    assert result.repo_id == f"{fake_hub.user}/bare-name"
    card = fake_hub.files(result.repo_id)["README.md"].decode()
    assert f'PeftModel.from_pretrained(base, "{fake_hub.user}/bare-name")' in card


# ---------------------------------------------------------------------------------------------------------------------
# (g) a card the Hub understands: model-index, no local path, sample completions; the same card in output_dir


def _text_of(name: str, data: bytes) -> str | None:
    """What a reader of the uploaded file sees as text: a safetensors header, a text file; None for an image."""
    if name.endswith(".safetensors"):
        return data[8 : 8 + int.from_bytes(data[:8], "little")].decode()
    if name.endswith(".png"):
        return None
    return data.decode()


def _local_paths_in(text: str, run_dir: Path) -> list[str]:
    needles = {str(run_dir), str(run_dir.resolve()), str(run_dir.parent.parent), str(Path.home()), str(Path.cwd())}
    return [n for n in needles if n in text] + ABSOLUTE_PATH.findall(text)


def _samples(card: str) -> list[tuple[str, int]]:
    return [(grade, int(index)) for grade, index in re.findall(r"\*\*\d\. (\w+)\*\* \(held-out problem (\d+)", card)]


def test_pushed_card_has_model_index_no_local_path_and_samples(run_dir, fake_hub):
    hub.push(run_dir, REPO)
    files = fake_hub.files(REPO)
    card = files["README.md"].decode()
    results = json.loads((run_dir / "eval_results.json").read_text())

    # model-index, read back the way the Hub reads it
    data = ModelCard(card).data
    assert data.model_name == "tiny-grpo" and data.license == "apache-2.0" and data.base_model is None
    assert [
        (r.task_type, r.dataset_type, r.dataset_split, r.metric_type, r.metric_name, r.metric_value)
        for r in data.eval_results
    ] == [
        ("text-generation", "arithmetic", "test", "accuracy", "accuracy", round(results["after"]["accuracy"], 4)),
        (
            "text-generation",
            "arithmetic",
            "test",
            "accuracy",
            "accuracy (before training)",
            round(results["before"]["accuracy"], 4),
        ),
    ]
    settings = results["settings"]
    assert f"on {settings['num_problems']} held-out problems of hf_grpo arithmetic word problems, split `test`" in card

    # sample completions from eval_after.jsonl, uploaded with the other per-problem records
    records = {r["index"]: r for r in map(json.loads, (run_dir / "eval_after.jsonl").read_text().splitlines())}
    shown = _samples(card)
    assert "## Sample completions" in card and len(shown) == min(5, len(records))
    for grade, index in shown:
        assert records[index]["grade"] == grade
        assert f"Completion:\n\n```text\n{records[index]['completion']}\n```" in card
    right = sum(r["grade"] == "correct" for r in records.values())
    assert sum(grade == "correct" for grade, _ in shown) == min(right, 3 + max(0, 2 - (len(records) - right)))
    for name in ("eval_before.jsonl", "eval_after.jsonl"):
        assert files[name] == (run_dir / name).read_bytes()

    # license and citations: TRL, GRPO, and DAPO since the tiny recipe samples dynamically
    assert "## License" in card and "@misc{vonwerra2020trl," in card
    assert "arXiv:2402.03300" in card and "eprint        = {2503.14476}" in card

    # no path of this machine in anything uploaded (the run's output_dir is in recipe.yaml and adapter_config.json)
    assert str(run_dir) in (run_dir / "recipe.yaml").read_text()
    for upload in fake_hub.uploads:
        text = _text_of(upload.path, upload.content)
        assert text is None or _local_paths_in(text, run_dir) == [], upload.path


def test_local_readme_is_the_card_the_push_uploads(run_dir, fake_hub):
    local = (run_dir / "README.md").read_text()  # written by the training run (hf_grpo.train -> write_local_card)
    assert "[More Information Needed]" not in local and _local_paths_in(local, run_dir) == []
    hub.push(run_dir, REPO)
    pushed = fake_hub.files(REPO)["README.md"].decode()

    local_meta, pushed_meta = ModelCard(local).data.to_dict(), ModelCard(pushed).data.to_dict()
    assert (
        local_meta["model-index"][0].pop("name") == "run" and pushed_meta["model-index"][0].pop("name") == "tiny-grpo"
    )
    assert local_meta == pushed_meta and local_meta["model-index"][0]["results"]

    def sections(card):
        return dict(part.split("\n", 1) for part in card.split("\n## ")[1:])

    local_sections, pushed_sections = sections(local), sections(pushed)
    assert local_sections.keys() == pushed_sections.keys()
    assert {k for k in local_sections if local_sections[k] != pushed_sections[k]} == {"Usage"}
    assert 'PeftModel.from_pretrained(base, "run")' in local_sections["Usage"]
    assert "before any push" in local_sections["Usage"] and "before any push" not in pushed
