"""The scripts ``tests/test_vllm_standin.py`` runs in fresh interpreters: TRL 1.16's own vLLM code (``VLLMGeneration``
in colocate mode, ``VLLMClient``, GRPO runs) against the activated stand-in ``vllm`` package.

Each script takes its arguments from ``sys.argv`` and writes what it observed to the JSON file named last.
"""

PRELUDE = """
import importlib.util, json, os, sys
result = {}
import hf_grpo.vllm_standin.engine, hf_grpo.vllm_standin.transport, hf_grpo.vllm_standin.server
from hf_grpo import vllm_standin
spec = importlib.util.find_spec("vllm")  # None here; a real vLLM where one is installed
result["vllm_before_activate"] = None if spec is None else spec.origin
vllm_standin.activate()
"""

TRAINING = """
from transformers import AutoModelForCausalLM, AutoTokenizer
from hf_grpo.config import HfGRPOConfig
from hf_grpo.data import DataArguments, load_grpo_datasets
from hf_grpo.vllm_standin.engine import combined_digest, tensor_digest
from hf_grpo.training.trainer import GRPOTrainer

def alternating(prompts, completions, **kwargs):
    return [float(i % 2) for i in range(len(prompts))]  # a learning signal in every group: the policy moves

def grpo_args(work, **vllm):
    return HfGRPOConfig(output_dir=work, per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
                        learning_rate=5e-2, lr_scheduler_type="constant", max_steps=2, logging_steps=1, report_to=[],
                        save_strategy="no", seed=0, disable_tqdm=True, bf16=False, use_vllm=True, **vllm)

def history(trainer):
    return [{k: v for k, v in r.items() if isinstance(v, (int, float))} for r in trainer.state.log_history]
"""

COLOCATE_SCRIPT = (
    PRELUDE
    + TRAINING
    + """
model_dir, work, result_path = sys.argv[1:4]
import importlib.metadata
import torch
from accelerate import Accelerator
from trl.import_utils import is_vllm_available
from trl.generation.vllm_generation import VLLMGeneration
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

result["version"] = importlib.metadata.version("vllm")
result["trl_sees_vllm_0_28"] = is_vllm_available(min_version="0.28.0")
result["pythonpath_first"] = os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(vllm_standin.STANDIN_DIR)

# --- TRL's VLLMGeneration, colocate mode with sleep mode: init, generate (which syncs), sync after an update
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
T = 0.7
gen = VLLMGeneration(model, Accelerator(cpu=True), tok, mode="colocate", gpu_memory_utilization=0.3,
                     enable_sleep_mode=True, temperature=T, max_completion_length=6, logprobs=0)
llm = gen.llm
try:
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2), use_tqdm=False)
    result["generate_after_init"] = "generated"
except RuntimeError as exc:
    result["generate_after_init"] = str(exc)
prompts = [tok("What is 2+3?")["input_ids"], tok("Add 40 and 2.")["input_ids"]]
batch = [prompts[0], prompts[0], prompts[1], prompts[1]]

@torch.no_grad()
def processed_logprobs(m, prompt, completion):
    logits = m(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    return (logits / T).log_softmax(-1)[torch.arange(len(completion)), torch.tensor(completion)].tolist()

def observe(references):
    prompt_ids, completion_ids, logprobs, token_ids = gen.generate(batch, None, num_generations=2)
    out = {"prompt_ids_ok": prompt_ids == batch, "rows": len(completion_ids),
           "aligned": all(t == [[c] for c in ids] and len(lp) == len(ids)
                          for ids, lp, t in zip(completion_ids, logprobs, token_ids)),
           "loaded_per_sync": llm.standin_stats["tensors_loaded"]}
    for key, reference in references.items():
        out[key] = max(abs(a - b[0]) for p, ids, lp in zip(prompt_ids, completion_ids, logprobs)
                       for a, b in zip(processed_logprobs(reference, p, ids), lp))
    return out

import copy
original = copy.deepcopy(model)
result["first"] = observe({"error_vs_policy": model})
with torch.no_grad():  # an optimizer step, in effect
    g = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.add_(0.2 * torch.randn(p.shape, generator=g))
result["after_update"] = observe({"error_vs_policy": model, "error_vs_old_policy": original})
result["stats"] = dict(llm.standin_stats)
result["params"] = len(list(model.parameters()))
result["asleep_after_generate"] = llm.llm_engine.is_sleeping()

# --- vLLM's strictness, reached the way TRL reaches it
llm.wake_up()
runner_model = llm.llm_engine.model_executor.driver_worker.model_runner.model
errors = {}
for key, call in {
    "unknown_name": lambda: runner_model.load_weights([("model.no_such.weight", torch.zeros(2))]),
    "wrong_shape": lambda: runner_model.load_weights([("model.norm.weight", torch.zeros(3))]),
    "greedy_n2": lambda: SamplingParams(n=2, temperature=0.0),
    "top_p_0": lambda: SamplingParams(top_p=0.0),
    "discarded": lambda: llm.generate([{"prompt_token_ids": [1, 2]}], SamplingParams(max_tokens=2)),
}.items():
    try:
        call()
        errors[key] = None
    except (ValueError, AssertionError, VLLMValidationError, RuntimeError) as exc:
        errors[key] = f"{type(exc).__name__}: {exc}"
result["errors"] = errors

# --- a GRPO run, colocate mode, LoRA: record what TRL sends at each sync and what the stand-in holds after it
from peft import LoraConfig
train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=64, arithmetic_eval_size=8))
trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=alternating,
                      args=grpo_args(work, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3),
                      train_dataset=train, processing_class=tok,
                      peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                             task_type="CAUSAL_LM"))
vg, syncs = trainer.vllm_generation, []
iterate = vg._iter_named_params

def recorded():
    sent = {}
    for name, tensor in iterate():
        sent[name] = tensor_digest(tensor)
        yield name, tensor
    held = vg.llm.llm_engine.engine.weight_digests()
    syncs.append({"digest": combined_digest(sent), "held": combined_digest(held), "names_equal": set(sent) == set(held),
                  "step": trainer.state.global_step})

vg._iter_named_params = recorded
trainer.train()
result["grpo"] = {"syncs": syncs, "stats": dict(vg.llm.standin_stats), "history": history(trainer),
                  "steps": trainer.state.global_step}
json.dump(result, open(result_path, "w"))
"""
)

SERVER_SCRIPT = (
    PRELUDE
    + TRAINING
    + """
model_dir, url, port, grpo_port, work, result_path = sys.argv[1:7]
import requests, torch
vllm_standin.patch_trl_for_cpu()
from trl.generation.vllm_client import VLLMClient

tok = AutoTokenizer.from_pretrained(model_dir)
prompt = tok("What is 2+3?")["input_ids"]

@torch.no_grad()
def greedy(m, ids, steps):
    out = []
    for _ in range(steps):
        out.append(int(m(input_ids=torch.tensor([ids + out])).logits[0, -1].argmax()))
    return out

# --- TRL's VLLMClient: generate, init_communicator on a CPU device, update_named_params, close_communicator
client = VLLMClient(base_url=url, group_port=int(port), connection_timeout=60)
out = client.generate([prompt, prompt[:3]], n=2, max_tokens=5)
result["generate"] = {"prompt_ids_ok": out["prompt_ids"] == [prompt, prompt[:3]], "rows": len(out["completion_ids"]),
                      "aligned": all(len(c) == len(l) for c, l in zip(out["completion_ids"], out["logprobs"]))}
result["logprobs_mode"] = client.get_server_info()["model_config"]["logprobs_mode"]
before = client.generate([prompt], max_tokens=8, temperature=0.0)["completion_ids"][0]
client.init_communicator(device=torch.device("cpu"))
model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
with torch.no_grad():
    g = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.add_(0.3 * torch.randn(p.shape, generator=g))
metadata = [(n, str(p.dtype).removeprefix("torch."), list(p.shape)) for n, p in model.named_parameters()]
client.update_named_params(metadata, ((n, p.data) for n, p in model.named_parameters()))
client.reset_prefix_cache()
served = requests.get(url + "/fixture/weights", timeout=10).json()["sha256"]
result["server_equals_trainer"] = served == {n: tensor_digest(p) for n, p in model.named_parameters()}
after = client.generate([prompt], max_tokens=8, temperature=0.0)["completion_ids"][0]
result["greedy"] = {"changed": after != before, "equals_local": after == greedy(model, prompt, len(after))}
client.close_communicator()
requests.post(url + "/start_weight_update", json={}, timeout=10)
r = requests.post(url + "/update_weights", timeout=10,
                  json={"update_info": {"names": ["model.norm.weight"], "dtype_names": ["float32"], "shapes": [[64]]}})
result["after_close"] = [r.status_code, r.json()["error"]["message"]]

# --- a GRPO run, server mode, full weights through TRL's weight transfer: record every update TRL sends
train, _ = load_grpo_datasets(DataArguments(arithmetic_train_size=64, arithmetic_eval_size=8))
trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model_dir), reward_funcs=alternating,
                      args=grpo_args(work, vllm_mode="server", vllm_server_base_url=url,
                                     vllm_group_port=int(grpo_port), vllm_server_timeout=60),
                      train_dataset=train, processing_class=tok)
vclient, sent_digests = trainer.vllm_generation.vllm_client, []
update = vclient.update_named_params

def recorded(metadata, named_params):
    sent = {}
    def tap():
        for name, tensor in named_params:
            sent[name] = tensor_digest(tensor)
            yield name, tensor
    update(metadata, tap())
    sent_digests.append(combined_digest(sent))

vclient.update_named_params = recorded
trainer.train()
result["grpo"] = {"sent": sent_digests, "history": history(trainer), "steps": trainer.state.global_step,
                  "trainer_final": combined_digest({n: tensor_digest(p) for n, p in trainer.model.named_parameters()})}
json.dump(result, open(result_path, "w"))
"""
)
