"""Shared bases shipped with the package (mlmt_bench/warmstart/shipped_bases.py): a shipped entry
is installed into the cache instead of a build, every file checked first; a changed file is one
line and leaves the cache as it was; the switch builds instead; and the quickstart's base is the
shipped one, intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from mlmt_bench.errors import UserError
from mlmt_bench.machine import reproducible
from mlmt_bench.runner import base_config
from mlmt_bench.spec import load_experiment
from mlmt_bench.warmstart import shared_base as sb, shipped_bases

REPO = Path(__file__).resolve().parents[1]


def _entry(cache: Path, cfg: sb.BaseConfig) -> Path:
    """A cache entry of ``cfg`` as a build leaves it (base.json and model/), with made-up weights."""
    entry = cache / cfg.key()
    (entry / "model").mkdir(parents=True)
    save_file({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, str(entry / "model" / "model.safetensors"))
    (entry / "model" / "config.json").write_text('{"model_type": "llama"}\n')
    report = {"key": cfg.key(), "config": cfg.model_dump(mode="json"), "check": {"acc@t1": 0.5},
              "sha256": reproducible.weights_sha256(entry / "model"), "environment": {"cpu": "Some CPU"}}
    (entry / "base.json").write_text(json.dumps(report) + "\n")
    return entry


@pytest.fixture()
def shipped(tmp_path, monkeypatch) -> tuple[sb.BaseConfig, Path]:
    """A base config whose entry is shipped from a temporary package folder; the build refuses to run."""
    monkeypatch.setattr(shipped_bases, "SHIPPED_DIR", tmp_path / "package")
    monkeypatch.delenv(shipped_bases.SWITCH, raising=False)
    cfg = sb.BaseConfig(seed=3, steps=7)
    shipped_bases.ship(_entry(tmp_path / "elsewhere", cfg), tmp_path / "package")

    def no_build(*args, **kwargs):
        raise AssertionError("built a base that is shipped")
    monkeypatch.setattr(sb, "_build", no_build)
    # its made-up weights cannot generate: the critic gate (tests/test_gates.py) is measured as recorded here
    monkeypatch.setattr(sb, "gate_check", lambda *a, **k: {"greedy": {}, "sampled": {}})
    return cfg, tmp_path / "package" / cfg.key()


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_shipped_base_is_installed_instead_of_built(shipped, tmp_path):
    cfg, entry = shipped
    manifest = json.loads((entry / shipped_bases.MANIFEST).read_text())
    assert sorted(manifest) == ["base.json", "model/config.json", "model/model.safetensors"]
    cache = tmp_path / "cache"
    base = sb.ensure_base(cfg, cache, progress=False, require_valid=False)
    assert base.directory == cache / cfg.key() and base.report["environment"] == {"cpu": "Some CPU"}
    # the entry's files byte for byte, no manifest, nothing temporary left; the weights as recorded; beside
    # them the critic gate's record (METHOD v4), measured on first use
    assert _files(base.directory) == {**{k: v for k, v in _files(entry).items() if k != shipped_bases.MANIFEST},
                                      sb.GATE_FILE: (base.directory / sb.GATE_FILE).read_bytes()}
    assert [p.name for p in cache.iterdir()] == [cfg.key()]
    assert reproducible.weights_sha256(base.model_dir) == base.report["sha256"]
    # a second use reads the cache (the shipped copy could be gone by then)
    (entry / "base.json").unlink()
    assert sb.ensure_base(cfg, cache, progress=False, require_valid=False).report == base.report


@pytest.mark.parametrize("damage", ["changed", "missing"])
def test_a_shipped_base_that_differs_from_its_manifest_is_one_line_and_installs_nothing(shipped, tmp_path, damage):
    cfg, entry = shipped
    weights = entry / "model" / "model.safetensors"
    if damage == "changed":
        data = bytearray(weights.read_bytes())
        data[-1] ^= 1
        weights.write_bytes(bytes(data))
    else:
        weights.unlink()
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match=r"^shipped base [0-9a-f]{16}: model/model\.safetensors is missing or "
                                        r"differs from its sha256 in files\.json; reinstall mlmt-bench, or set "
                                        r"MLMT_BENCH_SHIPPED_BASES=0 to build it here$"):
        sb.ensure_base(cfg, cache, progress=False, require_valid=False)
    assert not cache.exists() or list(cache.iterdir()) == []


def test_a_manifest_cannot_name_a_file_outside_its_entry(shipped, tmp_path):
    cfg, entry = shipped
    (tmp_path / "secret").write_text("x")
    manifest = json.loads((entry / shipped_bases.MANIFEST).read_text())
    manifest["../../secret"] = shipped_bases._sha256(tmp_path / "secret")
    (entry / shipped_bases.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=r"\.\./\.\./secret is missing or differs"):
        shipped_bases.install(cfg.key(), tmp_path / "cache")


def test_an_entry_cannot_be_shipped_onto_itself(shipped):
    _, entry = shipped
    before = _files(entry)
    with pytest.raises(UserError, match="is already the shipped entry of base"):
        shipped_bases.ship(entry, entry.parent)
    assert _files(entry) == before


def test_the_switch_builds_instead(shipped, tmp_path, monkeypatch):
    cfg, _ = shipped
    monkeypatch.setenv(shipped_bases.SWITCH, "0")
    assert shipped_bases.find(cfg.key()) is None
    with pytest.raises(AssertionError, match="built a base that is shipped"):
        sb.ensure_base(cfg, tmp_path / "cache", progress=False)


def test_the_quickstarts_base_ships_intact_and_runs_as_allowed_invalid(monkeypatch):
    """Every seed of the quickstart names a shipped entry (so no newcomer builds it, and every
    machine starts from the same weights), whose files match its manifest and whose weights are
    the ones its base.json records, valid by METHOD v3's thresholds on its own check. It fails
    METHOD v4's critic gate (measured by `mlmt-bench base`: J -0.026 greedy, +0.047 with the critic
    at T=0.5), so its spec runs it with ``allow_invalid`` and every report says so at its top."""
    monkeypatch.delenv(shipped_bases.SWITCH, raising=False)
    for name, value in reproducible.PIN.items():  # the CLI runs pinned: the key says so
        monkeypatch.setenv(name, value)
    exp, arms = load_experiment(REPO / "registry" / "runs" / "quickstart.yaml")
    for seed in exp.seeds:
        keys = {base_config(arm.model_copy(update={"seed": seed})).key() for arm in arms.values()}
        assert len(keys) == 1, keys  # one shared base for every arm
        key = keys.pop()
        entry = shipped_bases.find(key)
        assert entry is not None, f"the quickstart's seed-{seed} base {key} is not shipped"
        shipped_bases.verify(entry)
        report = json.loads((entry / "base.json").read_text())
        assert report["key"] == key and report["config"]["seed"] == seed
        assert reproducible.weights_sha256(entry / "model") == report["sha256"]
        assert sb.validity_failures(report["check"]) == []
        assert {base_config(arm.model_copy(update={"seed": seed})).allow_invalid for arm in arms.values()} == {True}
