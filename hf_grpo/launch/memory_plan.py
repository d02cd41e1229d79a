"""The memory plan of a run, per device of its layout, before any model loads: what each part of training and
generation holds, the peak of each device, and a verdict against the device's memory with the change that makes an
unfit recipe fit. ``hf_grpo.recipe`` builds the inputs (the model's shape from its ``config.json`` or the published
configs below) and prints the plan in ``--dry-run`` and at the start of every run; a recipe that cannot fit exits 2.

    python -m hf_grpo.train recipes/qwen1.5b-gsm8k-8gb.yaml --dry-run            # its plan on its 8 GB GPU
    python -m hf_grpo.train recipes/qwen7b.yaml --accelerate_config ddp --num_processes 1 --dry-run   # does not fit

What is counted, per training process (bytes of what PyTorch allocates; a GPU adds its CUDA context, a CPU the
process's Python and libraries):
- weights: the frozen base (model dtype; 4-bit where quantized) and the trainable part (a LoRA adapter is float32,
  PEFT's default), sharded over the processes by ZeRO-3 or FSDP;
- gradients and optimizer states of the trainable part: AdamW's two moments, with DeepSpeed's float32 master copy in
  mixed precision, sharded by ZeRO stage (1: states, 2: + gradients, 3: + weights) and moved to host RAM by
  ``offload_optimizer_device: cpu``; the reference model when ``beta > 0`` without LoRA;
- then the largest of the phases, which do not overlap: one training micro-batch (the tensors autograd keeps for the
  backward, per token and layer from the architecture; with activation checkpointing only each layer's input plus
  one layer; TRL's fused LM head scores the completion in tiles of ``TOKEN_CHUNK_SIZE`` x its vocabulary chunk, so
  the ``[rows, completion, vocab]`` logits never exist); HF generate's KV cache and last-token logits for a
  generation batch; the same for an evaluation batch; the warm start's micro-batch, whose loss builds the float32
  logits of the solutions' tokens.
vLLM takes ``gpu_memory_utilization`` of each of its GPUs (colocated: the training process gets the rest) for its
weights, activations and KV cache; the plan compares the tokens a generation batch keeps in flight with the cache.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace


GiB = 1024**3
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
# Planning allowances, not measurements: what CUDA and its libraries hold outside PyTorch's allocator, and what vLLM
# needs besides weights and KV cache (activations of its profiling run, CUDA graphs) on each of its GPUs.
CUDA_CONTEXT = int(0.6 * GiB)
VLLM_OVERHEAD = int(1.5 * GiB)
FITS_WITHIN = 0.95  # a device is planned full at 95 % of its memory: allocator fragmentation and what is not counted

# Longest prompt in a batch, in tokens, with the template and chat template, by dataset: for the embedded ones the
# 99th percentile over the data with SmolLM2's tokenizer (a batch of 8 to 32 rows rarely holds the very longest;
# benchmarks/memory_plan_check.py prints them); for the hub ones an estimate from their longest problems.
# A dataset not listed plans with DEFAULT_PROMPT_TOKENS, and says so.
PROMPT_TOKENS = {
    "arithmetic": 60,
    "arithmetic_reasoning": 70,
    "arithmetic_transfer": 70,
    "word_problems": 96,
    "word_problems_held_out": 73,
    "gsm8k": 300,
    "math": 600,
    "math500": 600,
    "openmathinstruct2": 600,
}
TINY_PROMPT_TOKENS = 30  # the embedded tiny model's byte-level tokenizer on arithmetic
DEFAULT_PROMPT_TOKENS = 512
GOLD_TOKENS = 44  # the warm start's worked solutions: 43 tokens at most on the embedded data (SmolLM2's tokenizer)


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a decoder: its size and every linear layer's shape (for LoRA)."""

    name: str
    source: str  # where the numbers come from: a config.json on this machine, or a published config
    params: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype: str  # the config's torch_dtype: what `dtype: auto` loads
    linears: tuple[tuple[str, int, int], ...]  # (module name, in features, out features), output head included

    @property
    def kv_bytes_per_token(self) -> int:
        """Elements of one token's keys and values over all layers (times the cache dtype's bytes)."""
        return 2 * self.layers * self.kv_heads * self.head_dim

    def lora_params(self, rank: int, targets) -> int:
        """Parameters of a LoRA adapter of ``rank`` on ``targets`` (PEFT's rules: ``all-linear`` is every linear
        layer but the output head, a list matches module names by suffix, a string is a regular expression)."""
        if targets in (None, "all-linear", ["all-linear"]):
            chosen = [lin for lin in self.linears if lin[0] != "lm_head"]
        elif isinstance(targets, str):
            chosen = [lin for lin in self.linears if re.fullmatch(targets, lin[0])]
        else:
            chosen = [lin for lin in self.linears if any(lin[0] == t or lin[0].endswith(f".{t}") for t in targets)]
        return sum(rank * (n_in + n_out) for _, n_in, n_out in chosen)

    def saved_per_token(self, repeat_kv: bool = True) -> int:
        """Elements autograd keeps per token and layer of a Llama/Qwen2 decoder layer trained through LoRA or in
        full: each norm's input and output (4 x hidden), the attention input to o_proj (hidden), the rotated queries,
        keys and values the attention saves (keys and values repeated to every head where a padding mask rules out
        the grouped kernel), and the MLP's gate, its SiLU, up and their product (4 x intermediate). Checked against
        ``torch.autograd.graph.saved_tensors_hooks`` on SmolLM2 (tests/test_memory_plan.py)."""
        q = self.heads * self.head_dim
        kv = q if repeat_kv else self.kv_heads * self.head_dim
        return 5 * self.hidden + q + 2 * kv + 4 * self.intermediate


def shape_from_config(config, name: str, source: str) -> ModelShape:
    """A ModelShape from a transformers config of a Llama-style decoder (Llama, Qwen2/3, Mistral, SmolLM2)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    h, n_layers, vocab = text.hidden_size, text.num_hidden_layers, text.vocab_size
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or h // heads
    inter = text.intermediate_size
    q, kv = heads * head_dim, kv_heads * head_dim
    per_layer = [("q_proj", h, q), ("k_proj", h, kv), ("v_proj", h, kv), ("o_proj", q, h)]
    per_layer += [("gate_proj", h, inter), ("up_proj", h, inter), ("down_proj", inter, h)]
    linears = [(f"model.layers.{i}.{n}", a, b) for i in range(n_layers) for n, a, b in per_layer]
    linears.append(("lm_head", h, vocab))
    tied = bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))
    bias = q + 2 * kv if getattr(text, "model_type", "") == "qwen2" else 0  # Qwen2's q/k/v biases
    layer_params = sum(a * b for _, a, b in per_layer) + bias + 2 * h
    params = vocab * h * (1 if tied else 2) + n_layers * layer_params + h
    dtype = str(getattr(config, "dtype", None) or "float32")
    return ModelShape(
        name, source, params, h, n_layers, heads, kv_heads, head_dim, inter, vocab, dtype.replace("torch.", ""),
        tuple(linears),
    )  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """The recipe's values the plan reads (``hf_grpo.recipe.memory`` fills it)."""

    dtype: str  # weights: float32, bfloat16, float16
    mixed_precision: bool  # bf16/fp16 autocast: activations in 2 bytes
    use_peft: bool
    lora_r: int
    lora_targets: object
    lora_dropout: float
    load_in_4bit: bool
    processes: int
    zero_stage: int | None  # DeepSpeed ZeRO stage; None without DeepSpeed
    fsdp: bool
    offload_optimizer: bool
    beta: float
    per_device_batch: int  # completions a micro-batch
    generation_batch: int  # completions a process generates at once (HF generate)
    eval_batch: int  # held-out rows generated at once
    prompt_tokens: int
    eval_prompt_tokens: int
    completion_tokens: int
    eval_completion_tokens: int
    activation_checkpointing: bool
    warm_start_batch: int  # 0: no warm start
    generation: str  # "hf", "vllm_colocate", "vllm_server"
    vllm_utilization: float | None = None
    vllm_tensor_parallel: int = 1
    prompts_per_generation: int = 0  # the whole generation batch, all processes: for vLLM's cache
    num_generations: int = 1
    on_gpu: bool = True
    vllm_cpu_cache_gb: float = 0.0  # VLLM_CPU_KVCACHE_SPACE of a vLLM server on CPU cores
    shared_prompts: bool = False  # hf_grpo's shared forward (not with checkpointing, ZeRO-3 or FSDP)


@dataclass(frozen=True)
class Term:
    name: str
    nbytes: int
    key: str = ""  # the recipe key that changes it most

    def text(self) -> str:
        return f"{self.name}: {gb(self.nbytes)}"


@dataclass
class DevicePlan:
    """One device kind of the layout and what it holds at its peak."""

    label: str  # "training GPU (each of 8)", "vLLM server GPU", "host RAM"
    static: list[Term]
    phases: list[Term]  # the largest of these lands on top of the static terms
    capacity: int | None = None  # bytes; None: not known here
    capacity_source: str = ""
    notes: list[str] = field(default_factory=list)
    copies: int = 1  # processes that each hold all of it at once (training processes on one CPU)

    @property
    def peak_phase(self) -> Term | None:
        return max(self.phases, key=lambda t: t.nbytes) if self.phases else None

    @property
    def peak(self) -> int:
        return self.copies * (sum(t.nbytes for t in self.static) + (self.peak_phase.nbytes if self.phases else 0))

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.peak <= FITS_WITHIN * self.capacity

    def largest(self) -> Term:
        terms = [*self.static, *([self.peak_phase] if self.phases else [])]
        return max(terms, key=lambda t: t.nbytes)


def gb(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f} GB" if nbytes < 10 * GiB else f"{nbytes / GiB:.1f} GB"


def _dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


def training_terms(shape: ModelShape, s: Settings) -> tuple[list[Term], list[Term]]:
    """(terms on each training device, terms in host RAM) for one training process, before its phases."""
    n = s.processes
    wbytes = _dtype_bytes(s.dtype)
    trainable = shape.lora_params(s.lora_r, s.lora_targets) if s.use_peft else shape.params
    shard_weights = n if (s.zero_stage == 3 or s.fsdp) else 1
    device, host = [], []
    if s.use_peft:
        if s.load_in_4bit:  # the linear layers in 4 bits (+ a scale per 64 weights), the rest in the dtype
            linear = sum(a * b for name, a, b in shape.linears if name != "lm_head")
            base = int(linear * 0.5 * (1 + 4 / 64)) + (shape.params - linear) * wbytes
        else:
            base = shape.params * wbytes
        device.append(Term("frozen base weights", base // shard_weights, "load_in_4bit"))
    tbytes = 4 if s.use_peft else wbytes  # a LoRA adapter is float32 (PEFT casts it up); full fine-tuning: the dtype
    master = s.zero_stage is not None and tbytes == 2  # DeepSpeed keeps a float32 master copy in mixed precision
    label = f"LoRA adapter ({trainable / 1e6:.1f}M parameters)" if s.use_peft else "trainable weights"
    device.append(Term(label, trainable * tbytes // shard_weights, "use_peft"))
    sharded_grads = (s.zero_stage or 0) >= 2 or s.fsdp
    device.append(Term("gradients", trainable * tbytes // (n if sharded_grads else 1), "accelerate_config"))
    states = trainable * (12 if master else 2 * tbytes)  # AdamW's two moments (+ the master copy)
    states //= n if (s.zero_stage or 0) >= 1 or s.fsdp else 1
    optimizer = Term("optimizer states (AdamW" + (" + fp32 master weights" if master else "") + ")", states,
                     "accelerate_config")  # fmt: skip
    if s.offload_optimizer:
        host.append(replace(optimizer, name=optimizer.name + ", offloaded"))
        if sharded_grads and master:  # ZeRO-Offload's float32 gradients live beside the states
            host.append(Term("fp32 gradients of the offloaded optimizer", trainable * 4 // n))
    else:
        device.append(optimizer)
    if s.beta > 0 and not s.use_peft:  # with LoRA the reference is the adapter switched off
        device.append(Term("reference model (beta > 0)", shape.params * wbytes // shard_weights, "beta"))
    return device, host


def phase_terms(shape: ModelShape, s: Settings, cpu_factor: float = 1.0) -> list[Term]:
    """The phases of a training process, which do not overlap; ``cpu_factor``: resident bytes a CPU's allocator
    holds per byte of transient tensors (1.0 on a GPU, whose caching allocator is what the plan counts)."""
    from trl.kernels.chunked_logprob import TOKEN_CHUNK_SIZE  # TRL's fused LM head: tokens a tile scores at once
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE as VOCAB_CHUNK  # and vocabulary columns

    abytes = 2 if (s.mixed_precision or _dtype_bytes(s.dtype) == 2) else 4
    seq = s.prompt_tokens + s.completion_tokens
    per_layer = shape.saved_per_token() * abytes  # per token
    if s.use_peft and s.lora_dropout > 0:  # each adapted layer keeps its own dropped-out input and its mask
        per_layer += sum(n_in for _, n_in, _ in shape.linears[:7]) * (abytes + 1)
    rows, completion = s.per_device_batch, s.completion_tokens
    if s.activation_checkpointing:  # each layer's input, and one layer recomputed in the backward
        saved = rows * seq * (shape.layers * shape.hidden * abytes + per_layer)
        scored = rows * (seq if not s.on_gpu else completion)
    elif s.shared_prompts:  # hf_grpo.training.shared_prompts: each distinct prompt once, then the rows' completions
        distinct = min(rows, max(s.prompts_per_generation // s.processes, 1))
        keys = 2 * shape.heads * shape.head_dim * abytes  # the prompt's keys and values each row's attention keeps
        suffix = completion + 1
        saved = shape.layers * (distinct * s.prompt_tokens * per_layer + rows * suffix * per_layer
                                + rows * s.prompt_tokens * keys)  # fmt: skip
        scored = rows * suffix
    else:  # TRL's forward: whole rows; its LM head scores every position where it cannot run Triton (a CPU)
        saved = rows * seq * shape.layers * per_layer
        scored = rows * (seq if not s.on_gpu else completion)
    tile = min(scored, TOKEN_CHUNK_SIZE) * min(shape.vocab, VOCAB_CHUNK) * abytes
    # the head's tiles: Triton folds one in place (forward, backward); torch's fold on a CPU makes ~5 tile-sized
    # temporaries (float copy, shifted, exp, their product); plus the float32 gradient of the hidden states
    head = tile * (2 if s.on_gpu else 5) + scored * shape.hidden * 4
    how = " (checkpointed)" if s.activation_checkpointing else ""
    fix = "per_device_train_batch_size" if s.activation_checkpointing else "activation_checkpointing"
    phases = [
        Term(f"training micro-batch, {rows} x {seq} tokens: activations{how} + LM head tiles", saved + head, fix)
    ]
    kv = shape.kv_bytes_per_token * abytes
    last_logits = shape.vocab * 4 * 2  # a row's last-token logits in float32, and the sampling's copy
    if s.generation == "hf":
        phases.append(Term(f"HF generate, {s.generation_batch} x {seq} tokens: KV cache + logits",
                           s.generation_batch * (seq * kv + last_logits), "generation.backend"))  # fmt: skip
    if s.eval_batch:
        eval_seq = s.eval_prompt_tokens + s.eval_completion_tokens
        phases.append(Term(f"evaluation, {s.eval_batch} x {eval_seq} tokens: KV cache + logits",
                           s.eval_batch * (eval_seq * kv + last_logits), "per_device_eval_batch_size"))  # fmt: skip
    if s.warm_start_batch:  # a causal-LM loss on the solutions: their float32 logits, log-softmax and its gradient
        ws_seq = s.prompt_tokens + GOLD_TOKENS
        ws = s.warm_start_batch * (ws_seq * shape.layers * per_layer + GOLD_TOKENS * shape.vocab * 4 * 3)
        phases.append(Term(f"warm start, {s.warm_start_batch} x {ws_seq} tokens: activations + solution logits", ws,
                           "warm_start_batch_size"))  # fmt: skip
    return [replace(t, nbytes=int(t.nbytes * cpu_factor)) for t in phases]


def vllm_terms(shape: ModelShape, s: Settings, capacity: int | None) -> tuple[list[Term], list[str]]:
    """What vLLM needs on each of its GPUs besides its KV cache, and a line comparing the cache its share
    (``gpu_memory_utilization``) leaves with the tokens a generation batch keeps in flight (too few only queue
    requests: slower, no error)."""
    tp = max(s.vllm_tensor_parallel, 1)
    weights = shape.params * 2 // tp  # served in bf16
    terms = [Term("vLLM weights (bf16)", weights, "generation.tensor_parallel_size"),
             Term("vLLM activations and CUDA graphs (allowance)", VLLM_OVERHEAD)]  # fmt: skip
    if capacity is None or s.vllm_utilization is None:
        return terms, []
    cache = int(s.vllm_utilization * capacity) - weights - VLLM_OVERHEAD
    if cache <= 0:
        return terms, ["vLLM's share holds no KV cache: raise generation.gpu_memory_utilization"]
    in_flight = s.prompts_per_generation * s.num_generations * (s.prompt_tokens + s.completion_tokens)
    if s.generation == "vllm_colocate":
        in_flight //= max(s.processes, 1)  # each colocated engine serves its own process
    slots = cache // (shape.kv_bytes_per_token * 2 // tp)
    enough = "enough" if slots >= in_flight else "too few: vLLM queues the rest (slower, no error)"
    return terms, [
        f"vLLM KV cache {gb(cache)} = {slots:,} tokens; a generation batch keeps {in_flight:,} in flight: {enough}"
    ]


@dataclass
class MemoryPlan:
    shape: ModelShape
    settings: Settings
    devices: list[DevicePlan]
    assumptions: list[str] = field(default_factory=list)

    @property
    def unfit(self) -> DevicePlan | None:
        return next((d for d in self.devices if d.fits is False), None)

    def verdict(self) -> str:
        device = self.unfit
        if device is not None:
            return f"does not fit: {device.label} needs {gb(needed_gb(device) * GiB)}, has {gb(device.capacity)}"
        known = [d for d in self.devices if d.fits]
        if not known:
            return "no verdict: the device's memory is not known here (set gpu_memory_gb to plan for a GPU)"
        margin = min(known, key=lambda d: d.capacity - d.peak)
        return f"fits: {margin.label} {gb(margin.peak)} of {gb(margin.capacity)} ({gb(margin.capacity - margin.peak)} spare)"

    def lines(self) -> list[str]:
        s = self.shape
        size = f"{s.params / 1e9:.3g}B" if s.params >= 1e9 else f"{s.params / 1e6:.3g}M"
        out = [f"memory plan ({s.name}: {size} parameters, {s.source}):"]
        for device in self.devices:
            have = f" of {gb(device.capacity)} ({device.capacity_source})" if device.capacity else ""
            out.append(f"  {device.label}: peak {gb(device.peak)}{have}")
            out += [f"    {t.text()}" for t in device.static]
            if device.phases:
                peak, others = device.peak_phase, [t for t in device.phases if t is not device.peak_phase]
                out.append(f"    largest phase, {peak.text()}")
                out += [f"      (not at once: {t.text()})" for t in others]
            out += [f"    {note}" for note in device.notes]
        out += [f"  assumed: {a}" for a in self.assumptions]
        out.append(f"  verdict: {self.verdict()}")
        return out


def needed_gb(device: DevicePlan) -> float:
    """Memory the device would need, in GiB (its peak over the planned fill of FITS_WITHIN)."""
    return device.peak / FITS_WITHIN / GiB


# Training on a CPU: what a process holds before its model (Python, torch, transformers, TRL, datasets imported:
# 0.47 GB resident, measured on this project's 2-core machine, 2026-12-05), and the resident bytes glibc's allocator
# holds per byte of the tensors a phase keeps (freed temporaries between them): 1.9 for one SmolLM2 micro-batch's
# forward and backward, measured alone (benchmarks/memory_plan_check.py --terms).
CPU_PROCESS = int(0.5 * GiB)
CPU_ALLOCATOR_FACTOR = 1.9


def make_plan(
    shape: ModelShape,
    s: Settings,
    gpu: tuple[int, str] | None = None,
    host: tuple[int, str] | None = None,
    assumptions: list[str] | None = None,
) -> MemoryPlan:
    """The plan of every device kind of the layout. ``gpu``/``host``: (bytes, where the number comes from) of a GPU
    and of this machine's RAM, where known."""
    device_terms, host_terms = training_terms(shape, s)
    devices = []
    if s.on_gpu:
        capacity, source = gpu or (None, "")
        static, notes = [Term("CUDA context (allowance)", CUDA_CONTEXT), *device_terms], []
        if s.generation == "vllm_colocate":
            vllm, notes = vllm_terms(shape, s, capacity)
            share = int(s.vllm_utilization * capacity) if capacity and s.vllm_utilization else None
            static.append(Term(f"vLLM's share (gpu_memory_utilization {s.vllm_utilization})",
                               share or sum(t.nbytes for t in vllm), "generation.gpu_memory_utilization"))  # fmt: skip
        label = "training GPU" + (f" (each of {s.processes})" if s.processes > 1 else "")
        devices.append(DevicePlan(label, static, phase_terms(shape, s), capacity, source, notes))
        if s.generation == "vllm_server":
            vllm, notes = vllm_terms(shape, s, capacity)
            share = (int(s.vllm_utilization * capacity), f"gpu_memory_utilization x {gb(capacity)}") if (
                capacity and s.vllm_utilization) else (None, "")  # fmt: skip
            devices.append(DevicePlan("vLLM server GPU", vllm, [], *share, notes))
        if host_terms:
            capacity, source = host or (None, "")
            label = "host RAM" + (f" ({s.processes} training processes, each)" if s.processes > 1 else "")
            devices.append(DevicePlan(label, host_terms, [], capacity, source, copies=s.processes))
    else:
        static = [Term("Python and libraries (measured)", CPU_PROCESS), *device_terms, *host_terms]
        if s.generation == "vllm_server":
            static.append(Term("vLLM CPU server: weights + VLLM_CPU_KVCACHE_SPACE",
                               int(shape.params * 2 + s.vllm_cpu_cache_gb * GiB), "generation.backend"))  # fmt: skip
        capacity, source = host or (None, "")
        label = "RAM" + (f" ({s.processes} training processes, each)" if s.processes > 1 else "")
        phases = phase_terms(shape, s, CPU_ALLOCATOR_FACTOR)
        devices.append(DevicePlan(label, static, phases, capacity, source, copies=s.processes))
    return MemoryPlan(shape, s, devices, list(assumptions or []))


def _halvings(value: int, floor: int = 1) -> list[int]:
    out = []
    while value // 2 >= floor:
        value //= 2
        out.append(value)
    return out


def candidate_fixes(s: Settings) -> list[tuple[str, object, Settings]]:
    """Single changes that lower memory, each as (recipe key, value, changed settings)."""
    fixes = []
    if not s.activation_checkpointing:
        fixes.append(("activation_checkpointing", True, replace(s, activation_checkpointing=True)))
    fixes += [
        ("per_device_train_batch_size", v, replace(s, per_device_batch=v)) for v in _halvings(s.per_device_batch)
    ]
    fixes += [("per_device_eval_batch_size", v, replace(s, eval_batch=v)) for v in _halvings(s.eval_batch)]
    fixes += [("warm_start_batch_size", v, replace(s, warm_start_batch=v)) for v in _halvings(s.warm_start_batch)]
    if s.on_gpu and s.processes > 1 and s.zero_stage != 3 and not s.fsdp:
        fixes.append(("accelerate_config", "zero3", replace(s, zero_stage=3, offload_optimizer=False)))
    if s.on_gpu and not s.offload_optimizer:
        fixes.append(("accelerate_config", "zero2_offload", replace(s, zero_stage=max(s.zero_stage or 0, 2),
                                                                   offload_optimizer=True)))  # fmt: skip
    if not s.use_peft:
        fixes.append(("use_peft", True, replace(s, use_peft=True, lora_r=16, lora_targets="all-linear")))
    elif s.on_gpu and not s.load_in_4bit:
        fixes.append(("load_in_4bit", True, replace(s, load_in_4bit=True)))
    if s.generation == "vllm_colocate" and s.vllm_utilization:
        lower = [round(s.vllm_utilization - 0.05 * i, 2) for i in range(1, 10)]
        fixes += [("generation.gpu_memory_utilization", v, replace(s, vllm_utilization=v)) for v in lower if v > 0]
    return fixes


def find_fix(plan: MemoryPlan, gpu=None, host=None) -> tuple[str, object, MemoryPlan] | None:
    """The first single change that makes ``plan`` fit, trying those that shrink its largest term first; None when
    no single change does."""
    device = plan.unfit
    if device is None:
        return None
    largest = device.largest().key
    fixes = candidate_fixes(plan.settings)
    fixes.sort(key=lambda fix: fix[0] != largest)  # stable: the order above within each group
    for key, value, settings in fixes:
        changed = make_plan(plan.shape, settings, gpu, host, plan.assumptions)
        if changed.unfit is None:
            return key, value, changed
    return None
