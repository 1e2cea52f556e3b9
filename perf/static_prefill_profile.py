"""Where the static decoder's time goes on SmolLM2 with a LoRA adapter: prefill against decode steps, and the ops.

A benchmark, not a test (its output is quoted in perf/README.md, "Compacted rows"): the shipped warm start
(3c10cf883fe0ec32) in float32 with an all-linear r16 adapter (unmerged, as runs have it), ``ROWS`` random prompts
of ``PROMPT`` tokens, greedy, every row forced to ``NEW`` tokens, one thread. It prints the process CPU time of a
call that generates one token (the prefill) and of one that generates ``NEW``, the difference per decode step, and
the torch profiler's table (self CPU time) over one more ``NEW``-token call.

    .venv/bin/python perf/static_prefill_profile.py 64 400 24
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WARM_START = Path.home() / ".cache" / "mlmt-bench" / "warm-start" / "3c10cf883fe0ec32" / "model"


def main() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mlmt_bench.rollout.hf_backend import HFBackend

    rows, prompt_tokens, new_tokens = (int(a) for a in sys.argv[1:4])
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(WARM_START), dtype=torch.float32).eval()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    tok = AutoTokenizer.from_pretrained(str(WARM_START))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 1000, (prompt_tokens,), generator=g).tolist() for _ in range(rows)]
    backend = HFBackend(batch_size=256, decode="static")

    def cpu_seconds(n: int) -> float:
        model.generation_config.min_new_tokens = n
        c = time.process_time()
        with torch.no_grad():
            backend.generate(model, tok, prompts, max_new_tokens=n, temperature=0.0, top_p=1.0, seed=0)
        return time.process_time() - c

    cpu_seconds(2)  # warm-up
    one, full = cpu_seconds(1), cpu_seconds(new_tokens)
    print(f"prefill + 1 token: {one:.2f} s CPU; prefill + {new_tokens}: {full:.2f} s CPU; "
          f"per decode step {(full - one) / (new_tokens - 1) * 1000:.0f} ms")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        cpu_seconds(new_tokens)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
