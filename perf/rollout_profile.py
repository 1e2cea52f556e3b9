"""Where a GRPO training rollout's CPU time goes on SmolLM2: torch profiler over one ``generate`` call.

A benchmark, not a test. The shape of ``grpo_step_time.py``'s SmolLM2 comparison: an all-linear r16 LoRA (B
random, so that merging matters), 4 random prompts of 82 tokens × 4 samples each, 32 new tokens forced, temperature
1, top-p 1, one thread; the ``hf`` backend on the decode path given (``static+merge``: the static decoder with
``merge_lora``; ``static``; ``generate``). One warm-up call, two timed calls, then the profiler's table (self CPU
time) over one more.

    .venv/bin/python perf/rollout_profile.py [static+merge|static|generate]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ROWS_PER_PROMPT, PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 4, 4, 82, 32


def main() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mlmt_bench.models.pretrained import resolve
    from mlmt_bench.rollout.hf_backend import HFBackend

    path = sys.argv[1] if len(sys.argv) > 1 else "static+merge"
    torch.set_num_threads(1)
    model_dir = resolve("smollm2-135m-instruct")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.01)
    model.eval()
    model.generation_config.min_new_tokens = NEW_TOKENS
    tok = AutoTokenizer.from_pretrained(model_dir)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 1000, (PROMPT_TOKENS,), generator=g).tolist() for _ in range(PROMPTS)]
    prompts = [p for p in prompts for _ in range(ROWS_PER_PROMPT)]
    options = {"decode": "static", "merge_lora": path.endswith("merge")} if path.startswith("static") else {}
    backend = HFBackend(batch_size=256, **options)

    def call() -> None:
        with torch.no_grad():
            backend.generate(model, tok, prompts, max_new_tokens=NEW_TOKENS, temperature=1.0, top_p=1.0, seed=0)

    call()
    for _ in range(2):
        t = time.perf_counter()
        call()
        print(f"{path}: {time.perf_counter() - t:.2f} s a call", flush=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
