"""A cached shared base is trusted only once checked (issue 34, items 2 and 6): one flipped byte in
its weights, a base.json that is not a record, a pickle file beside the weights or an entry another
uid owns are each one line, and a run records the hash of the weights it loads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mlmt_bench.errors import UserError
from mlmt_bench.warmstart import shared_base
from mlmt_bench.warmstart.shared_base import BaseConfig, ensure_base
from support import TINY


@pytest.fixture(scope="module")
def cached(tmp_path_factory) -> tuple[Path, BaseConfig]:
    cache = tmp_path_factory.mktemp("cache")
    cfg = BaseConfig(**TINY)
    ensure_base(cfg, cache, progress=False)
    return cache, cfg


def _copy(cached: tuple[Path, BaseConfig], tmp_path: Path) -> tuple[Path, Path, BaseConfig]:
    import shutil

    cache, cfg = cached
    mine = tmp_path / "cache"
    shutil.copytree(cache, mine)
    return mine, mine / cfg.key(), cfg


def test_an_intact_entry_is_used_and_its_loaded_hash_recorded(cached, tmp_path):
    cache, entry, cfg = _copy(cached, tmp_path)
    base = ensure_base(cfg, cache, progress=False)
    assert base.summary()["sha256"] == json.loads((entry / "base.json").read_text())["sha256"]


def test_one_flipped_byte_in_the_weights_is_refused(cached, tmp_path):
    cache, entry, cfg = _copy(cached, tmp_path)
    weights = next((entry / "model").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01  # inside the last tensor's data, past the header
    weights.write_bytes(bytes(data))
    with pytest.raises(UserError, match="weights sha256 .* differ from the .* its base.json records"):
        ensure_base(cfg, cache, progress=False)


@pytest.mark.parametrize("content", ["not json {", "[1, 2]", '{"no": "config"}'])
def test_a_base_json_that_is_no_record_is_one_line(cached, tmp_path, content):
    cache, entry, cfg = _copy(cached, tmp_path)
    (entry / "base.json").write_text(content)
    with pytest.raises(UserError, match="base.json"):
        ensure_base(cfg, cache, progress=False)


def test_a_huge_sparse_base_json_is_refused_unread(cached, tmp_path):
    cache, entry, cfg = _copy(cached, tmp_path)
    with open(entry / "base.json", "wb") as f:
        f.truncate(200 << 20)
    with pytest.raises(UserError, match="more than the limit"):
        ensure_base(cfg, cache, progress=False)


def test_a_pickle_beside_the_weights_is_refused(cached, tmp_path):
    cache, entry, cfg = _copy(cached, tmp_path)
    (entry / "model" / "pytorch_model.bin").write_bytes(b"\x80\x04planted")
    with pytest.raises(UserError, match="pytorch_model.bin .*pickle"):
        ensure_base(cfg, cache, progress=False)


def test_an_entry_of_another_uid_is_refused(cached, tmp_path, monkeypatch):
    cache, entry, cfg = _copy(cached, tmp_path)
    monkeypatch.setattr(os, "getuid", lambda: os.lstat(entry).st_uid + 1)
    with pytest.raises(UserError, match="owned by uid"):
        ensure_base(cfg, cache, progress=False)


def test_the_hash_is_computed_once_until_the_files_change(cached, tmp_path, monkeypatch):
    cache, entry, cfg = _copy(cached, tmp_path)
    calls = []
    from mlmt_bench.machine import reproducible
    real = reproducible.weights_sha256
    monkeypatch.setattr(reproducible, "weights_sha256", lambda d: calls.append(d) or real(d))
    for _ in range(3):
        ensure_base(cfg, cache, progress=False)
    assert len(calls) == 1
    weights = next((entry / "model").glob("*.safetensors"))
    os.utime(weights, ns=(1, 1))
    ensure_base(cfg, cache, progress=False)
    assert len(calls) == 2
    assert shared_base._VERIFIED[str(entry / "model")][1] == real(entry / "model")
