#!/usr/bin/env bash
# A GPU session's one call (issue 37): the stages of benchmarks/gpu_session.py (the kernel's and the decomposition's
# CUDA tests, one layer, the encoder, where the time goes, then the summary), under 9 minutes on one H100, the files
# into $OUT. The GPU machine (python3 with torch, triton and transformers, no `datasets`, no network) needs nothing
# carried: src/ goes on the Python path.
#   bash benchmarks/gpu_session.sh               # on the GPU machine
#   bash benchmarks/gpu_session.sh --rehearse    # on CPU, tiny shapes, the kernel under Triton's interpreter (CI)
# Other arguments go to gpu_session.py (--stage, --deadline, --out); PYTHON picks the interpreter (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
case " $* " in *" --rehearse "*) export TRITON_INTERPRET=1 ;; esac  # before anything imports triton
exec "${PYTHON:-python3}" benchmarks/gpu_session.py "$@"
