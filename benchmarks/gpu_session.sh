#!/usr/bin/env bash
# A GPU session's one call (issues 37, 47 and 62): the stages of benchmarks/gpu_session.py, ordered by what decides
# the GPU speed issue's bars, 490 s of stage budgets on one H100 or H200 (Triton's and Inductor's compilation
# included), each stage writing its file into $OUT as it goes (8 files). Its plan is printed first; background
# processes compile the kernel's tilings ahead while the first stages run. The gate (45 s): the kernel against SDPA
# and float64, every gradient, each tiling; attention's device time, n = 2,048 and 8,192 first, plain first; the
# training step (`convattn pretrain`), batch 128 first, CUDA graphs first; the packages and the kernel's CUDA tests,
# the bars' first; the host's time per launch; FlexAttention with the time left; then the summary, each bar's
# verdict ("unverified" where the gate did not pass).
# The GPU machine (python3 with torch, triton and transformers, no `datasets`, no network) needs the kit for the
# training step, as benchmarks/real_scale.py does: make it here with `python benchmarks/real_scale.py pack`, then
#   device call: command "bash benchmarks/gpu_session.sh", carry [".gpu-kit"], timeout_s 600
# (its wheels are installed below; without the kit every other stage runs and the training step's rows say why not)
#   bash benchmarks/gpu_session.sh --rehearse    # on CPU, tiny shapes, the kernel under Triton's interpreter (CI)
# Other arguments go to gpu_session.py (--stage, --deadline, --out); PYTHON picks the interpreter (python3).
set -euo pipefail
export GPU_SESSION_STARTED="$(date +%s)"  # the stages' budgets count from here, the wheels' install included
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
# one GPU whatever the machine has: a process that sees several is refused by pretrain, compare and the
# fine-tuning commands (the Trainer would run DataParallel), and every row measures one GPU
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
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
