"""Registries: lazy entries, did-you-mean errors, third-party plugins through entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlmt_bench import registry
from mlmt_bench.errors import UserError
from mlmt_bench.registry import Registry, UnknownComponentError

ROOT = Path(__file__).resolve().parents[1]


def test_lazy_entry_is_imported_on_first_get():
    r = Registry("thing")
    r.register("dec", "decimal:Decimal", "decimal numbers")
    assert r.entry("dec").is_lazy
    import decimal

    assert r.get("dec") is decimal.Decimal
    assert not r.entry("dec").is_lazy


def test_unknown_name_lists_known_and_closest():
    with pytest.raises(UnknownComponentError) as exc:
        registry.benchmarks.get("gsm8")
    msg = str(exc.value)
    assert "unknown benchmark 'gsm8'; did you mean 'gsm8k'?" in msg and "math500" in msg


def test_unknown_name_without_close_match():
    with pytest.raises(UnknownComponentError) as exc:
        registry.algorithms.get("zzzzzz")
    assert "did you mean" not in str(exc.value) and "grpo" in str(exc.value)


def test_missing_optional_dependency_is_a_user_error():
    r = Registry("backend")
    r.register("ghost", "surely_not_installed_pkg_xyz:Engine", "needs a package that is absent")
    with pytest.raises(UserError, match="needs a package that is not installed"):
        r.get("ghost")


def test_descriptions_are_one_line():
    with pytest.raises(ValueError):
        Registry("x").register("a", object, "two\nlines")
    for reg in registry.REGISTRIES.values():
        for e in reg.entries():
            assert e.description and "\n" not in e.description


def test_duplicate_registration_refused():
    r = Registry("x")
    r.register("a", object, "a")
    with pytest.raises(ValueError):
        r.register("a", object, "again")


def test_every_builtin_entry_imports():
    # vllm is optional (GPU extra); everything else must resolve
    for kind, reg in registry.REGISTRIES.items():
        for e in list(reg.entries()):
            if e.name == "vllm":
                continue
            assert reg.get(e.name) is not None, (kind, e.name)


def test_import_is_light():
    code = ("import sys, mlmt_bench, mlmt_bench.registry, mlmt_bench.spec, mlmt_bench.cli; "
            "print([m for m in ('vllm', 'lm_eval', 'optuna', 'torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """The demo plugin (tests/plugin_pkg) installed with pip into a private target directory."""
    import shutil

    target = tmp_path_factory.mktemp("site")
    source = tmp_path_factory.mktemp("src") / "plugin_pkg"  # a copy: building writes build/ into it
    shutil.copytree(ROOT / "tests" / "plugin_pkg", source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, text=True)
    return target


def _cli(args, site: Path):
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "mlmt_bench.cli", *args], capture_output=True, text=True, env=env)


def test_plugin_components_are_listed(plugin_site):
    res = _cli(["--json", "list"], plugin_site)
    assert res.returncode == 0, res.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(res.stdout)}
    assert rows[("benchmark", "demo-echo")]["source"] == "mlmt-bench-demo-plugin"
    assert rows[("verifier", "demo-exact")]["description"] == "exact string match (plugin demo)"
    assert rows[("algorithm", "grpo")]["source"] == "builtin"


def test_plugin_components_are_usable(plugin_site, tmp_path):
    lines = [{"benchmark": "demo-echo", "id": "train/2", "response": "2"},
             {"benchmark": "demo-echo", "id": "train/3", "response": "4"}]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = _cli(["--json", "verify", "demo-exact", str(inp), "--out", str(tmp_path / "out.jsonl")], plugin_site)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["correct"] == 1
