"""Shared fixtures: a tiny untrained checkpoint and a minimal valid run spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    """An untrained tiny-0.5m HF checkpoint directory (model + char tokenizer)."""
    from mlmt_bench.models.tiny import build_tiny_model, save_checkpoint
    from mlmt_bench.models.tokenizer import build_char_tokenizer

    d = tmp_path_factory.mktemp("tiny") / "ckpt"
    tok = build_char_tokenizer()
    save_checkpoint(build_tiny_model("tiny-0.5m", tok, seed=0), tok, d)
    return d


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a test module: tiny models gain nothing from threads, and on the
    shared 2-core machine they made tests several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def minimal_spec(**over) -> dict:
    spec = {
        "name": "t",
        "benchmark": {"name": "synthetic-arith", "eval_limit": 8},
        "policies": {"solver": {"model": "tiny", "path": "CKPT"}},
        "algorithm": {"name": "grpo", "params": {"group_size": 4}},
        "train": {"steps": 2, "problems_per_step": 2},
    }
    for k, v in over.items():
        spec[k] = v
    return spec


@pytest.fixture
def write_spec(tmp_path):
    """write_spec(dict_or_text, name) -> path of a YAML file in tmp_path."""

    def _write(content, name: str = "spec.yaml") -> Path:
        p = tmp_path / name
        p.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
        return p

    return _write
