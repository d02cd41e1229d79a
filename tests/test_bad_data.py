"""Bad data: a prompt column that holds neither text nor chat messages stops the run at data load with
exit 2 and one line naming the column, the row and the type, instead of training on stringified prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_grpo.data.loaders import DataArguments, load_grpo_datasets
from hf_grpo.train import main

from .helpers.common import REPO, run_module


TINY = str(REPO / "recipes" / "tiny.yaml")
GOOD = {"q": "What is 0 + 0?", "a": "#### 0"}

MESSAGES = [{"role": "user", "content": "What is 1 + 1?"}]

# (case id, the prompts of the rows (a JSON column has one type per file), the bad row, what the line names)
BAD_PROMPTS = [
    ("dict", [{"text": "What is 0 + 0?", "lang": "en"}] * 3, 0, "dict with keys ['lang', 'text']"),
    ("int", [7, 8, 9], 0, "is a int"),
    ("float", [7.5], 0, "is a float"),
    ("list-of-strings", [["What is", "0 + 0?"]] * 2, 0, "list of str"),
    ("message-without-role", [MESSAGES, MESSAGES, [{"text": "What is 0 + 0?"}]], 2, "list of dict"),
    ("empty-list", [MESSAGES, []], 1, "empty list"),
    ("null-in-chat", [MESSAGES, None], 1, "is a null"),
]


def write_jsonl(path, prompts: list) -> str:
    path.write_text("".join(json.dumps({**GOOD, "q": p}) + "\n" for p in prompts))
    return str(path)


@pytest.mark.parametrize(("prompts", "row", "named"), [c[1:] for c in BAD_PROMPTS], ids=[c[0] for c in BAD_PROMPTS])
def test_a_prompt_that_is_not_text_or_messages_exits_2(prompts, row, named, tmp_path, capsys):
    data = write_jsonl(tmp_path / "bad.jsonl", prompts)
    argv = [TINY, "--dataset_name", data, "--prompt_column", "q", "--solution_column", "a", "--task", "gsm8k"]
    argv += ["--max_steps", "1", "--output_dir", str(tmp_path / "run"), "--report_to", "none"]
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert f"prompt_column 'q', row {row}:" in line and named in line, line
    assert "a prompt must be a string or a list of chat messages" in line, line
    assert not (tmp_path / "run" / "base_model").exists()  # refused before the model was built


def test_a_null_prompt_in_a_text_column_is_refused():
    """A string column needs no per-row check, but a null in it would become the prompt "None"."""
    args = DataArguments(dataset_name="x.jsonl", prompt_column="q", solution_column="a", task="gsm8k")
    from datasets import Dataset

    from hf_grpo.data.loaders import _to_grpo

    raw = Dataset.from_list([GOOD, {**GOOD, "q": None}, GOOD])
    with pytest.raises(ValueError, match=r"prompt_column 'q', row 1: the prompt is a null"):
        _to_grpo(raw, args, args.resolved(), "train")


def test_a_bad_prompt_is_named_by_its_row_in_the_file_before_the_split_shuffles_it(tmp_path):
    """With eval_split_size the rows were shuffled first, and a null at file row 116 was "row 8"."""
    prompts = [MESSAGES] * 200
    prompts[116] = None
    data = write_jsonl(tmp_path / "null.jsonl", prompts)
    args = DataArguments(dataset_name=data, prompt_column="q", solution_column="a", task="gsm8k", eval_split_size=0.1)
    with pytest.raises(ValueError, match=r"prompt_column 'q', row 116: the prompt is a null"):
        load_grpo_datasets(args)


def test_a_csv_that_is_not_utf8_exits_2_naming_the_file_and_the_fix(tmp_path, capsys):
    """A spreadsheet's cp1252 CSV ended in datasets' DatasetGenerationError traceback."""
    data = tmp_path / "cp1252.csv"
    data.write_bytes('q,a\n"Caf\u00e9 sells 3 + 4 cakes?","#### 7"\n'.encode("cp1252"))
    argv = [TINY, "--dataset_name", str(data), "--prompt_column", "q", "--solution_column", "a", "--task", "gsm8k"]
    code = main(argv + ["--max_steps", "1", "--output_dir", str(tmp_path / "run"), "--report_to", "none"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"dataset file {str(data)!r} is not UTF-8 text: byte e9" in lines[0], lines[0]
    assert "iconv -f cp1252 -t utf-8" in lines[0], lines[0]


def unwritable_folder(tmp_path) -> str | None:
    """A folder this process cannot create files in: a read-only one, or, for root (whom modes do not stop), one
    under sysfs; None when there is none."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys/kernel/hf_grpo_cache")):
        try:
            (candidate / "probe").mkdir(parents=True)
        except OSError:
            return str(candidate)
    return None


@pytest.mark.parametrize("where", ["read-only", "under a file"])
def test_a_read_only_datasets_cache_exits_2_before_the_model_loads(tmp_path, where):
    """A read-only HF_HOME / datasets cache ended in a PermissionError traceback from datasets; one under a regular
    file (a typo in HF_HOME) in a NotADirectoryError traceback."""
    if where == "under a file":
        (tmp_path / "a-file").write_text("")
        cache = str(tmp_path / "a-file" / "cache")
    else:
        cache = unwritable_folder(tmp_path)
    if cache is None:
        pytest.skip("no folder here refuses this process a write")
    data = write_jsonl(tmp_path / "ok.jsonl", ["What is 0 + 0?"] * 4)
    argv = [TINY, "--dataset_name", data, "--prompt_column", "q", "--solution_column", "a", "--task", "gsm8k"]
    result = run_module(
        "hf_grpo.train", *argv, "--output_dir", str(tmp_path / "run"), env={"HF_DATASETS_CACHE": cache}
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("hf_grpo: error:")]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "cannot write the datasets cache" in lines[0] and "set HF_DATASETS_CACHE (or HF_HOME)" in lines[0]
    assert cache in lines[0]
    assert not (tmp_path / "run" / "base_model").exists()


@pytest.mark.parametrize("system", [False, True])
def test_chat_format_jsonl_still_loads(system, tmp_path):
    messages = [{"role": "user", "content": "What is 0 + 0?"}]
    if system:
        messages.insert(0, {"role": "system", "content": "Answer after ####."})
    data = write_jsonl(tmp_path / "chat.jsonl", [messages] * 4)
    args = DataArguments(dataset_name=data, prompt_column="q", solution_column="a", task="gsm8k")
    train, _ = load_grpo_datasets(args)
    assert len(train) == 4 and train[0]["prompt"] == messages


def test_text_jsonl_still_loads(tmp_path):
    data = write_jsonl(tmp_path / "text.jsonl", ["What is 0 + 0?"] * 4)
    args = DataArguments(dataset_name=data, prompt_column="q", solution_column="a", task="gsm8k")
    train, _ = load_grpo_datasets(args)
    assert train[0]["prompt"] == [{"role": "user", "content": "What is 0 + 0?"}]


def test_empty_and_whitespace_prompts_are_dropped_with_a_warning(tmp_path, caplog):
    """20 % empty or whitespace-only prompts trained silently (on the template alone)."""
    prompts = ["What is 1 + 1?", "", "What is 2 + 2?", "  \n\t", "What is 3 + 3?"] * 2
    data = write_jsonl(tmp_path / "blank.jsonl", prompts)
    args = DataArguments(dataset_name=data, prompt_column="q", solution_column="a", task="gsm8k")
    train, _ = load_grpo_datasets(args)
    assert len(train) == 6 and all("What is" in str(p) for p in train["prompt"])
    assert "dropped 4 of 10 rows whose prompt (column 'q') is empty or only whitespace" in caplog.text
    chats = [[{"role": "user", "content": " "}]] * 3
    args = DataArguments(
        dataset_name=write_jsonl(tmp_path / "c.jsonl", chats), prompt_column="q", solution_column="a", task="gsm8k"
    )
    with pytest.raises(ValueError, match="prompt_column 'q' is empty in every row"):
        load_grpo_datasets(args)


def test_chat_prompts_for_a_tokenizer_without_a_chat_template_are_refused_before_the_model_loads(
    tmp_path, capsys, monkeypatch
):
    """A tokenizer with no chat template and a conversational dataset failed after the model loaded."""
    import transformers

    from hf_grpo.models.tiny import build_model, build_tokenizer

    folder = tmp_path / "model"
    tokenizer = build_tokenizer()
    build_model(tokenizer, hidden_size=32).save_pretrained(folder)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the tokenizer was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_model)
    data = write_jsonl(tmp_path / "chat.jsonl", [MESSAGES] * 8)
    argv = [TINY, "--model_name_or_path", str(folder), "--dataset_name", data, "--prompt_column", "q"]
    argv += ["--solution_column", "a", "--task", "gsm8k", "--output_dir", str(tmp_path / "run"), "--report_to", "none"]
    argv += ["--per_device_train_batch_size", "8"]  # a generation of 4 prompts: the 8 rows are enough
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]
    assert len(lines) == 1 and "has no chat template and the prompts are chat messages" in lines[0], err[-3000:]


def one_error_line(code: int, capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf_grpo: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def file_argv(data, tmp_path, *more: str) -> list[str]:
    argv = [TINY, "--dataset_name", str(data), "--prompt_column", "q", "--solution_column", "a", "--task", "gsm8k"]
    return argv + ["--output_dir", str(tmp_path / "run"), "--report_to", "none", *more]


def test_a_jsonl_file_whose_last_line_is_cut_off_exits_2_naming_the_line_at_the_check(tmp_path, capsys):
    """A copy that stopped mid-line ended in datasets' DatasetGenerationError traceback (ArrowInvalid "Missing a
    closing quotation mark"); the recipe check reads the file's last line, so a dry run refuses it too."""
    data = tmp_path / "cut.jsonl"
    text = "".join(json.dumps({**GOOD, "q": f"What is {i} + 0?"}) + "\n" for i in range(12))
    data.write_text(text[:-12])  # line 12 loses its end
    line = one_error_line(main(file_argv(data, tmp_path, "--dry-run")), capsys)
    assert f"dataset file {str(data)!r} holds a bad line 12: not JSON" in line, line
    assert "it is the last line and has no line end: the file was cut short" in line, line


def test_a_bad_line_inside_a_jsonl_file_exits_2_naming_it_before_the_model_loads(tmp_path, capsys):
    """Any other line that is not JSON is named when the data loads, before the model is built."""
    data = tmp_path / "bad.jsonl"
    lines = [json.dumps({**GOOD, "q": f"What is {i} + 0?"}) + "\n" for i in range(12)]
    lines[6] = '{"q": "What is 6 + 0?", "a": "#### 6",}\n'  # a trailing comma
    data.write_text("".join(lines))
    line = one_error_line(main(file_argv(data, tmp_path, "--max_steps", "1")), capsys)
    assert f"dataset file {str(data)!r} holds a bad line 7: not JSON (" in line, line
    assert "fix or remove that line" in line and "cut short" not in line, line
    assert not (tmp_path / "run" / "base_model").exists()  # refused before the model was built


def test_a_training_set_too_small_for_one_generation_exits_2_before_the_model_loads(tmp_path, capsys):
    """One row with num_generations 8 (32 prompts per generation) made 0 optimizer steps, then wrote an untrained
    adapter, a model card and a report."""
    data = write_jsonl(tmp_path / "one.jsonl", ["What is 0 + 0?"])
    line = one_error_line(main(file_argv(data, tmp_path, "--num_generations", "8", "--max_steps", "3")), capsys)
    assert "one generation needs 32 prompts (per_device_train_batch_size 256 x steps_per_generation 1" in line, line
    assert f"the training data ({data}) has 1 usable row(s)" in line and "0 optimizer steps" in line, line
    assert not (tmp_path / "run" / "base_model").exists()  # refused before the model was built
    assert not (tmp_path / "run" / "adapter_model.safetensors").exists()
