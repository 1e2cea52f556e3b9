"""A broken plugin is one line and exit 2, never a traceback nor a silent exit 0 (issue 34, item 6)."""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest
from typer.testing import CliRunner

from mlmt_bench import registry
from mlmt_bench.cli import app


class _EntryPoint:
    """What ``importlib.metadata.entry_points`` yields, for a plugin module planted in sys.modules."""

    def __init__(self, name: str, value: str) -> None:
        self.name, self.value, self.dist = name, value, None

    def load(self):
        module, attr = self.value.split(":")
        return getattr(importlib.import_module(module), attr)


def _exit_at_import(registries):  # never reached: the module exits while it is imported
    raise AssertionError


def _raises(registries):
    raise RuntimeError("the plugin's own bug\nsecond line")


def _rebinds_builtin(registries):
    registries["verifier"].register("math", "x:y", "a verifier named like a built-in")


@pytest.fixture()
def plant(monkeypatch):
    """plant(name, attr_value) installs module ``evil_plugin`` with ``register`` and one entry point."""
    saved = {k: dict(r._entries) for k, r in registry.REGISTRIES.items()}

    def install(register, *, exit_at_import: bool = False) -> None:
        mod = types.ModuleType("evil_plugin")
        mod.register = register
        monkeypatch.setitem(sys.modules, "evil_plugin", mod)
        if exit_at_import:
            monkeypatch.delitem(sys.modules, "evil_plugin")
            monkeypatch.setattr(importlib, "import_module", lambda name: sys.exit(0) if name == "evil_plugin"
                                else importlib.__import__(name))
        monkeypatch.setattr(importlib.metadata, "entry_points",
                            lambda group=None: [_EntryPoint("evil", "evil_plugin:register")])
        monkeypatch.setattr(registry, "_plugins_loaded", False)

    yield install
    for k, r in registry.REGISTRIES.items():
        r._entries = saved[k]


@pytest.mark.parametrize(("register", "exit_at_import", "fragment"), [
    (_raises, False, "register() failed: RuntimeError: the plugin's own bug"),
    (_rebinds_builtin, False, "register() failed: ValueError: verifier 'math' is already registered"),
    ("not a function", False, "its entry point is a str, not a register(registries) function"),
    (_exit_at_import, True, "failed to load: SystemExit: 0"),
])
def test_a_broken_plugin_is_one_line_and_exit_2(plant, register, exit_at_import, fragment):
    plant(register, exit_at_import=exit_at_import)
    res = CliRunner().invoke(app, ["list"])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: plugin 'evil'") and fragment in lines[0], res.output
    assert registry.verifiers.entry("math").source == "builtin"
