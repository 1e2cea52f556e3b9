"""perf/gpu_step_time.py end to end at toy size on the CPU (``--smoke``): every part runs and
the JSON holds what a GPU run would report. Slow (several subprocesses that import torch and TRL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_gpu_benchmark_smoke_run_writes_one_complete_json(tmp_path):
    pytest.importorskip("trl", reason="the bench extra (TRL) is not installed")
    out = tmp_path / "smoke.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, str(ROOT / "perf" / "gpu_step_time.py"), "--smoke", "--threads", "1",
                           "--out", str(out)], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["smoke"] and res["model"]["preset"] == "tiny-0.5m" and res["versions"]["trl"]
    # 2 problems x G 2 x 8 forced tokens on both sides, the same prompts
    for reward in ("task", "dense"):
        r = res["grpo"][reward]
        assert r["mlmt"]["generated_tokens_per_step"] == r["trl"]["generated_tokens_per_step"] == 32
        assert r["trl_prompts_match_mlmt"] is True
        assert r["mlmt"]["step_s"]["n"] == 1 and r["mlmt"]["step_s"]["mean"] > 0 and r["ratio_mlmt_over_trl"] > 0
    assert res["grpo"]["dense"]["mlmt"]["trained_tokens_per_step"] == 32  # the dense reward trains every token
    gen = res["generation"]
    assert gen["check"]["same_ids_fraction"] == 1.0 and gen["speed"]["same_ids"] is True
    assert set(gen["speed"]["tokens_per_s"]) == {"generate", "static"}
    mc = res["memory_case"]
    # per step: attempts 2 x 2, feedbacks x 2, refinements x 2, 8 tokens each
    assert mc["gen_tokens_per_step"] == [2 * 2 * 8 + 2 * 2 * 2 * 8 + 2 * 2 * 2 * 8]
    assert mc["plan_estimate_mb"]["peak"] > 0 and mc["critic_lora"]["r"] == 16
    one = res["memory_case_share_base"]  # the same case, both roles adapters on one base
    assert one["share_base"] and not mc["share_base"] and one["gen_tokens_per_step"] == mc["gen_tokens_per_step"]
