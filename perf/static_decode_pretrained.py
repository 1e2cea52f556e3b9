"""Decode speed on a pretrained model at evaluation's batch: ``generate`` vs ``decode: static``, the KV cache's cost.

A benchmark, not a test. ``perf/static_decode_speed.py`` measures the two paths on tiny models at 64 rows, where
the matrix products dominate; an evaluation of the SmolLM2 testbed decodes 160 rows at once after prompts of a few
hundred tokens, where ``generate``'s dynamic cache concatenates every layer's keys and values at every step, a
copy that grows with rows × context. This generates ``N`` new tokens
after ``B`` random prompts of ``T`` tokens with each path (every row forced to the full length by
``min_new_tokens``; greedy), in the order given, and prints the wall seconds of each call (prefill included).

Usage (from the repository root; ``make smollm2`` and the shipped warm start installed, or any HF directory as a
fifth argument)::

    .venv/bin/python perf/static_decode_pretrained.py ROWS PROMPT_TOKENS NEW_TOKENS PATHS [MODEL_DIR]
    .venv/bin/python perf/static_decode_pretrained.py 160 256 160 static,generate
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: the SmolLM2 testbed's warm start, which ships with the package (every pilot and headline run starts from it)
TESTBED_WARM_START = "3c10cf883fe0ec32"


def warm_start_dir() -> Path:
    """The testbed's warm start as its cache holds it (``$MLMT_BENCH_CACHE`` honoured), an HF directory."""
    from mlmt_bench.warmstart.pretrained_base import default_cache_dir

    return default_cache_dir() / TESTBED_WARM_START / "model"


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mlmt_bench.rollout.hf_backend import HFBackend

    rows, prompt_tokens, new_tokens = (int(a) for a in sys.argv[1:4])
    paths = sys.argv[4].split(",")
    model_dir = sys.argv[5] if len(sys.argv) > 5 else str(warm_start_dir())
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 1000, (prompt_tokens,), generator=g).tolist() for _ in range(rows)]
    model.generation_config.min_new_tokens = new_tokens
    for name in paths:
        backend = HFBackend(batch_size=256, decode=name)
        t = time.perf_counter()
        with torch.no_grad():
            gens = backend.generate(model, tok, prompts, max_new_tokens=new_tokens, temperature=0.0, top_p=1.0, seed=0)
        print(name, rows, prompt_tokens, new_tokens, round(time.perf_counter() - t, 1), "s",
              sum(len(x.ids) for x in gens), flush=True)


if __name__ == "__main__":
    main()
