#!/usr/bin/env bash
# A GPU session's one call (issues 37 and 47): the stages of benchmarks/gpu_session.py, what a user of the fused
# kernel meets, in under 8 minutes on one H100 or H200 (Triton's and Inductor's compilation included), each stage
# writing its file into $OUT as it goes (6 files): the kernel's CUDA tests (-x, 90 s at most); attention's device
# time (the profiler's kernel sums) against SDPA flash and SDPA with the same mask and dropout, the kernels' names;
# the host's time per call and per launch; the product's training step (`convattn pretrain`, composite against
# absolute and BertForMaskedLM, batch 128 and 512, eager, compiled and as CUDA graphs); then the summary, each
# bar's verdict.
# The GPU machine (python3 with torch, triton and transformers, no `datasets`, no network) needs the kit for the
# training step, as benchmarks/real_scale.py does: make it here with `python benchmarks/real_scale.py pack`, then
#   device call: command "bash benchmarks/gpu_session.sh", carry [".gpu-kit"]
# (its wheels are installed below; without the kit every other stage runs and the training step's rows say why not)
#   bash benchmarks/gpu_session.sh --rehearse    # on CPU, tiny shapes, the kernel under Triton's interpreter (CI)
# Other arguments go to gpu_session.py (--stage, --deadline, --out); PYTHON picks the interpreter (python3).
set -euo pipefail
export GPU_SESSION_STARTED="$(date +%s)"  # the stages' budgets count from here, the wheels' install included
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
case " $* " in
    *" --rehearse "*) export TRITON_INTERPRET=1 ;;  # before anything imports triton
    *)  # the kit's wheels (`datasets` and what it needs; built for the GPU machine's Python), once per machine, as
        # benchmarks/gpu.sh installs them ("site-packages" in the path: dill pickles modules from elsewhere by value)
        site=/tmp/convattn/site-packages
        if [ -d .gpu-kit/wheels ] && ! "$python" -c "import datasets" 2>/dev/null; then
            if [ -f "$site/.installed" ] || "$python" -m pip install -q --no-index --no-deps --no-compile \
                    --no-cache-dir --upgrade --target "$site" .gpu-kit/wheels/*.whl; then
                touch "$site/.installed"
                export PYTHONPATH="$site:$PYTHONPATH"
            else
                echo "gpu_session.sh: the kit's wheels did not install; the training step's rows will say so" >&2
            fi
        fi ;;
esac
exec "$python" benchmarks/gpu_session.py "$@"
