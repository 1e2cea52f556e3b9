"""Where a ``generate`` decode step spends its CPU time at evaluation's batch: torch profiler over SmolLM2 steps.

A benchmark, not a test (run 2026-12-06 on the 2-core EPYC, nothing else running; its output is quoted in
perf/README.md): the shipped warm start in float32, 160 random prompts of 400 tokens, one prefill, 12 timed decode
steps with transformers' dynamic cache, then the torch profiler's table over 3 more. ``lora`` as the first
argument adds an all-linear r16 adapter (unmerged, as runs have it).

    .venv/bin/python perf/decode_step_profile.py [lora]
"""

from __future__ import annotations

import sys
import time

ROWS, CONTEXT = 160, 400


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from static_decode_pretrained import warm_start_dir

    warm_start = warm_start_dir()
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(str(warm_start), dtype=torch.float32).eval()
    print(model.config._attn_implementation, model.config.num_hidden_layers, model.config.hidden_size)
    if len(sys.argv) > 1 and sys.argv[1] == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    ids = torch.randint(100, 1000, (ROWS, CONTEXT))
    with torch.no_grad():
        t = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        print("prefill", time.perf_counter() - t)
        cache = out.past_key_values
        nxt = torch.randint(100, 1000, (ROWS, 1))
        times = []
        for _ in range(12):
            t = time.perf_counter()
            cache = model(input_ids=nxt, past_key_values=cache, use_cache=True).past_key_values
            times.append(time.perf_counter() - t)
        print("decode step s", [round(x, 3) for x in times])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                cache = model(input_ids=nxt, past_key_values=cache, use_cache=True).past_key_values
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
