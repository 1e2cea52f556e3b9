"""Where the static decoder's time goes on SmolLM2 with a LoRA adapter: prefill against decode steps, and the ops.

A benchmark, not a test (its output is quoted in perf/README.md, "Compacted rows"): the shipped warm start
(3c10cf883fe0ec32) in float32 with an all-linear r16 adapter (unmerged, as runs have it), ``ROWS`` random prompts
of ``PROMPT`` tokens, greedy, every row forced to ``NEW`` tokens, one thread. It prints the process CPU time of a
call that generates one token (the prefill) and of one that generates ``NEW``, the difference per decode step, and
the torch profiler's table (self CPU time) over one more ``NEW``-token call; then the CPU time of merging every
adapted layer's ``W + s·B·A`` (``backend.options.merge_lora``, once per call) by peft's ``get_delta_weight`` and by
the fused ``addmm`` the decoder uses.

    .venv/bin/python perf/static_prefill_profile.py 64 400 24
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mlmt_bench.models.lora_weights import lora_layers, merge_into, merged_weight
    from mlmt_bench.rollout.hf_backend import HFBackend
    from static_decode_pretrained import warm_start_dir

    warm_start = warm_start_dir()
    rows, prompt_tokens, new_tokens = (int(a) for a in sys.argv[1:4])
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(warm_start), dtype=torch.float32).eval()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    tok = AutoTokenizer.from_pretrained(str(warm_start))
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
    # merge_lora's cost per call: every adapted layer's W + s·B·A, through peft's get_delta_weight (then added and
    # copied into the kept tensor) and through the fused addmm the decoder uses
    layers = list(lora_layers(model.get_base_model()).values())
    kept = [torch.empty_like(m.base_layer.weight) for m in layers]
    for label, merge in (("peft get_delta_weight + add + copy",
                          lambda m, t: t.copy_(merged_weight(m, m.base_layer.weight))),
                         ("fused addmm (merge_into)", merge_into)):
        times = []
        for _ in range(4):
            c = time.process_time()
            with torch.no_grad():
                for m, t in zip(layers, kept):
                    merge(m, t)
            times.append(time.process_time() - c)
        print(f"merge of {len(layers)} adapted layers, {label}: " + ", ".join(f"{t:.3f}" for t in times) + " s CPU")


if __name__ == "__main__":
    main()
