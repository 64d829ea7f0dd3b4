#!/usr/bin/env bash
# Run a command on a lent GPU machine (no network, no ../shared) with what it lacks, carried in .gpu-kit/:
# installs the kit's wheels once per machine, puts src/ on the Python path, then runs "$@" from the repo root.
# Make the kit here first, beside ../shared: `python benchmarks/real_scale.py pack`.
#
# A GPU session, in this order, each line one device call with carry [".gpu-kit"] (the machine stays warm for
# 30 s between calls, so the next call finds .gpu-work/ and the installed wheels):
#   bash benchmarks/gpu.sh python3 -m pytest -q -p no:cacheprovider tests/attention tests/test_compile.py
#   bash benchmarks/gpu.sh python3 benchmarks/attention_gpu.py --dropout 0 --output $OUT/attention_gpu_p0.md
#   bash benchmarks/gpu.sh python3 benchmarks/attention_gpu.py --dropout 0.1 --output $OUT/attention_gpu_p01.md
#   bash benchmarks/gpu.sh python3 benchmarks/real_scale.py unpack && bash benchmarks/gpu.sh python3 \
#       benchmarks/train_throughput.py --device cuda --compile --train-file .gpu-work/corpus/enwiki-2015-sample \
#       --tokenizer .gpu-kit/tokenizer --output $OUT/train_throughput_cuda.md
#   bash benchmarks/gpu.sh python3 benchmarks/real_scale.py run --out $OUT   # again until it says "finished"
# Copy what comes back into benchmarks/results/ and commit it in the same session. A session has 30 minutes of
# device time, the first start included: the lines above are in priority order (issue 25's bars, then 28's), and
# none of their GPU durations is measured yet, so give real_scale.py run a --budget (each model's training time,
# default 4m) that fits what is left, and keep the machine warm by making the next call at once.
set -euo pipefail
cd "$(dirname "$0")/.."
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
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$@"
