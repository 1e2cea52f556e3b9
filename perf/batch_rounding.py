"""Whether a row's logits depend on how many rows share its batch: SmolLM2 forwards on sub-batches.

A check, not a test (its answer depends on the CPU, the BLAS and the thread count). The shipped warm start in
float32 runs a batch of random rows (``rows`` × ``context`` tokens), then its first ``k`` rows alone for several
``k``, and prints per ``k`` whether those rows' logits are bit-identical to the full batch's, else the largest
difference. ``backend.options.compact`` decodes on fewer rows as rows end, so this says whether it can change ids.

    .venv/bin/python perf/batch_rounding.py THREADS      # e.g. 1 or 2
"""

from __future__ import annotations

import sys


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from static_decode_pretrained import warm_start_dir

    warm_start = warm_start_dir()
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    model = AutoModelForCausalLM.from_pretrained(str(warm_start), dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    for rows, context in [(160, 1), (37, 1), (160, 64)]:
        ids = torch.randint(100, 1000, (rows, context), generator=g)
        with torch.no_grad():
            full = model(ids).logits
            for k in [rows - 1, rows // 2, rows // 3 + 1, 7, 1]:
                part = model(ids[:k]).logits
                diff = (full[:k] - part).abs().max().item()
                print(rows, context, k, "bit-identical" if torch.equal(full[:k], part) else f"max diff {diff:.3g}",
                      flush=True)


if __name__ == "__main__":
    main()
