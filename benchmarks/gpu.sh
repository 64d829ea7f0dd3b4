#!/usr/bin/env bash
# Run a command on a lent GPU machine (no network, no ../shared) with what it lacks, carried in .gpu-kit/:
# installs the kit's wheels once per machine, puts src/ on the Python path, then runs "$@" from the repo root.
# Make the kit here first, beside ../shared: `python benchmarks/real_scale.py pack`.
#
# A GPU session's measurements are ONE call, `bash benchmarks/gpu_session.sh` with carry [".gpu-kit"] (issue 47:
# the kernel's CUDA tests, attention's device and host time against SDPA, the training step, under 8 minutes, files
# into $OUT; it installs the kit itself). This wrapper serves the other calls that need the kit, each a device call
# with carry [".gpu-kit"] under the 10-minute limit, e.g.
#   bash benchmarks/gpu.sh python3 benchmarks/real_scale.py unpack && bash benchmarks/gpu.sh python3 \
#       benchmarks/train_throughput.py --device cuda --compile --train-file .gpu-work/corpus/enwiki-2015-sample \
#       --tokenizer .gpu-kit/tokenizer --output $OUT/train_throughput_cuda.md
#   bash benchmarks/gpu.sh python3 benchmarks/real_scale.py run --out $OUT
# the real-scale run (issue 37): both models pretrained and brought back in one call, then
# `python benchmarks/real_scale.py glue --models <the call's files>` here on the CPU.
# Copy what comes back into benchmarks/results/ and commit it in the same session.
set -euo pipefail
cd "$(dirname "$0")/.."
# when the call began, for real_scale.py run's plan (the wheels' install below counts against the call too)
export CALL_STARTED="${CALL_STARTED:-$(date +%s.%N)}"
# "site-packages" in the path: dill (datasets' fingerprints) pickles by value any module from a path without it
site=/tmp/convattn/site-packages
if [ -d .gpu-kit/wheels ] && [ ! -f "$site/.installed" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .gpu-kit/wheels/*.whl
    touch "$site/.installed"
    # datasets 5.2 needs pyarrow >= 24 and fsspec <= 2026.9.0 from the image
    python3 -c "import pyarrow, fsspec; print('gpu.sh: pyarrow', pyarrow.__version__, 'fsspec', fsspec.__version__)"
fi
export PYTHONPATH="$site:$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
# one GPU whatever the machine has: a process that sees several is refused by pretrain, compare and the
# fine-tuning commands (the Trainer would run DataParallel), and every row measures one GPU
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$@"
