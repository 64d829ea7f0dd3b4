"""Each model's perplexity at 128, 512 and 1,024 tokens under 4 mask draws (seed 0-3), every length hiding the same
tokens: what context changes, beside what the draw alone moves (RESULTS 6.2). Run from the repository root after the
compare command there, into runs/lengths-check."""

import json
from pathlib import Path

from convattn.training.length_eval import evaluate_at_lengths

RUNS = Path("runs/lengths-check/runs")
TEXT = "../shared/data/wikitext-103-raw/wiki.valid.raw"

scores = {}
for name in ("chang2021-small--none", "chang2021-small--composite"):
    for seed in range(4):
        rows = evaluate_at_lengths(RUNS / name / "seed0", [TEXT], [128, 512, 1024], seed=seed)
        scores.setdefault(name, []).append([round(row.perplexity, 1) for row in rows])
        print(name, seed, scores[name][-1], [row.masked_tokens for row in rows], flush=True)
Path("benchmarks/results/lengths-same-text/mask_draws.json").write_text(json.dumps(scores) + "\n")
