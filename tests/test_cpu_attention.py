"""Reduced-precision attention under the CPU pin (mlmt_bench/models/cpu_attention.py): a tiny
model in bfloat16 trains a step and generates under ``ATEN_CPU_CAPABILITY=avx2`` on whatever CPU
runs the suite (on an Intel Xeon with AMX, torch's flash kernel raised there for 64+ tokens), and
its float32 outputs are those of the unwrapped attention, bit for bit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from mlmt_bench.models import cpu_attention
from mlmt_bench.models.tiny import build_tiny_model
from mlmt_bench.models.tokenizer import build_char_tokenizer

unwrapped = ALL_ATTENTION_FUNCTIONS["sdpa"]
tok = build_char_tokenizer()
ids = torch.randint(10, 40, (2, 80), generator=torch.Generator().manual_seed(0))
model = build_tiny_model("tiny-0.5m", tok, 0)  # installs the guard
assert getattr(ALL_ATTENTION_FUNCTIONS["sdpa"], cpu_attention._MARK)
with torch.no_grad():
    guarded = model(ids).logits
    ALL_ATTENTION_FUNCTIONS["sdpa"] = unwrapped
    plain = model(ids).logits
assert torch.equal(guarded, plain)  # float32 goes straight through
cpu_attention.install()
model = model.to(torch.bfloat16)
out = model(ids).logits.float()
out.sum().backward()
assert torch.isfinite(out).all()
gen = model.generate(ids[:, :70], max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
print("ok", torch.backends.cpu.get_cpu_capability(), gen.shape[1], *sorted(str(d) for d in cpu_attention._FAILED))
"""


def test_a_bfloat16_model_trains_and_generates_under_the_cpu_pin():
    env = {"PATH": "/usr/bin:/bin", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE",
           "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    words = proc.stdout.split()
    assert words[:3] == ["ok", "AVX2", "74"], proc.stdout
