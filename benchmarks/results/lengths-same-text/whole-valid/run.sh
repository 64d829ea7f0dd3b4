#!/usr/bin/env bash
# none and composite (RESULTS 6.2's command, 1 seed), then their length scores on all of WikiText-103 valid
set -euo pipefail
cd "$(dirname "$0")/../../../.."  # the repository root
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
convattn compare --presets chang2021-small/none,chang2021-small/composite \
  --layers 2 --hidden 128 --heads 4 --intermediate 512 --vocab-size 8000 --batch-size 32 --seq-len 128 \
  --lr 1e-3 --warmup 0.06 --max-steps 1500 --seeds 1 --eval-every 100 --save-every 250 --eval-samples 256 \
  --train-file ../shared/data/enwiki-2015-sample/ --eval-file ../shared/data/wikitext-103-raw/wiki.valid.raw \
  --output-dir runs/lengths-whole-valid --eval-lengths 128,512,1024 --eval-length-blocks all
echo DONE
