"""Peak RSS of one HF-backend generate of SmolLM2-135M-Instruct: a benchmark, not a test.

``ROWS`` chat prompts ("What is k * 7?"), exactly ``NEW`` new tokens each (``min_new_tokens``), at
temperature 0.7, bfloat16 autocast, 2 torch threads, one ``HFBackend(batch_size=ROWS).generate``
call in this fresh process; prints the peak RSS before and after the call, its wall and CPU
seconds and the first row's first log-probs (to compare two versions: they must agree).
``SOURCE`` is the checkout whose ``mlmt_bench`` is measured (run it once per version)::

    .venv/bin/python perf/generate_memory.py SOURCE ROWS NEW

Measured 2026-12-05, 2-core EPYC, other jobs running, ``OMP_NUM_THREADS=1``, 64 rows x 96 tokens:
peak RSS 2,833 MB with generate's per-step scores (commit cc4d4ff), 1,677 MB with the
log-prob-reading logits processor (14b5c75); identical log-probs.
"""

import resource
import sys
import time

sys.path.insert(0, sys.argv[1])

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from mlmt_bench.models import pretrained  # noqa: E402
from mlmt_bench.rollout.hf_backend import HFBackend  # noqa: E402

rows, new = int(sys.argv[2]), int(sys.argv[3])
d = pretrained.ensure_pretrained("smollm2-135m-instruct", progress=False)
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForCausalLM.from_pretrained(d)
model.generation_config.min_new_tokens = new
torch.set_num_threads(2)
torch.manual_seed(0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {i % 9 + 1} * 7?"}],
                                   add_generation_prompt=True, tokenize=True, return_dict=False) for i in range(rows)]
t, c = time.perf_counter(), time.process_time()
with torch.autocast("cpu", dtype=torch.bfloat16):
    out = HFBackend(batch_size=rows).generate(model, tok, prompts, max_new_tokens=new, temperature=0.7)
print({"rows": rows, "new": new, "peak_rss_mb_before_generate": before // 1024,
       "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
       "wall_s": round(time.perf_counter() - t, 1), "cpu_s": round(time.process_time() - c, 1),
       "tokens": sum(len(g.ids) for g in out), "first_logprobs": [round(x, 4) for x in out[0].logprobs[:5]]})
