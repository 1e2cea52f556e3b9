"""The package's import graph has no cycle (each arrow of docs/architecture.md points one way),
its folders stand on the floors of docs/architecture.md (a folder imports only from floors below
it, and from its own floor only along the arrows listed here), and no test module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mlmt_bench"


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        name = ".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every mlmt_bench module ``path`` imports, at module level or inside functions (a lazy import
    is still a dependency), except under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    found.add(full if full in modules else node.module)

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in modules and m != "mlmt_bench"}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles met by a depth-first search (empty exactly when the graph is acyclic)."""
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return cycles


def test_import_graph_has_no_cycle():
    modules = _modules()
    graph = {m: _imports(p, modules) for m, p in modules.items()}
    assert len(graph) > 40 and "mlmt_bench.evaluate" in graph["mlmt_bench.trainer"]  # the scan sees the package
    cycles = find_cycles(graph)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


# The floors of the house, lowest first: a unit (a sub-package or a module of the package root)
# imports from lower floors, and from its own floor only along SAME_FLOOR's arrows (the
# foundation's small modules may import each other; the cycle test keeps that one-way).
FLOORS: list[tuple[str, set[str]]] = [
    ("foundation", {"errors", "types", "registry", "tracking", "trackers", "machine", "io"}),
    ("components", {"verifiers", "rollout", "models", "metrics", "benchmarks", "fsdp"}),
    ("algorithms", {"algorithms"}),
    ("training", {"evaluate", "trainer", "probe", "warmstart"}),
    ("composition", {"spec", "runner", "plan"}),
    ("experiments", {"sweep", "experiment", "report", "external_eval", "export"}),
    ("interface", {"cli"}),
]
SAME_FLOOR: set[tuple[str, str]] = {
    ("metrics", "verifiers"),  # leakage rates use the verifiers' leak checks
    ("benchmarks", "models"), ("benchmarks", "rollout"),  # prompts are rendered with a tokenizer's chat template
    ("benchmarks", "verifiers"),  # nl-arith's oracle reads an attempt's answer as its verifier does
    ("fsdp", "rollout"),
    ("rollout", "models"), ("fsdp", "models"),  # a policy's model may be an adapter of a shared base (adapters.py)
    ("trainer", "evaluate"), ("warmstart", "evaluate"),
    ("runner", "spec"), ("plan", "spec"), ("plan", "runner"),  # plan builds what a run would build
    ("experiment", "report"), ("report", "sweep"),
    ("export", "external_eval"),  # an export picks the checkpoint `eval` picks
}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def floor_violations(graph: dict[str, set[str]]) -> list[str]:
    """The arrows between units that break FLOORS / SAME_FLOOR, and units on no floor."""
    floor = {unit: i for i, (_, units) in enumerate(FLOORS) for unit in units}
    out = []
    for module, deps in sorted(graph.items()):
        a = _unit(module)
        if a != "mlmt_bench" and a not in floor:
            out.append(f"{a} ({module}) stands on no floor: add it to FLOORS")
            continue
        for dep in sorted(deps):
            b = _unit(dep)
            if a == b or a == "mlmt_bench" or b not in floor:
                continue
            if floor[b] > floor[a] or (floor[b] == floor[a] and floor[a] > 0 and (a, b) not in SAME_FLOOR):
                out.append(f"{module} -> {dep} ({FLOORS[floor[a]][0]} -> {FLOORS[floor[b]][0]})")
    return out


def test_folders_import_only_downwards():
    modules = _modules()
    graph = {m: _imports(p, modules) for m, p in modules.items()}
    assert not floor_violations(graph), "\n".join(floor_violations(graph))
    used = {(_unit(m), _unit(d)) for m, ds in graph.items() for d in ds}
    assert not SAME_FLOOR - used, f"arrows listed but gone: {SAME_FLOOR - used}"  # the table stays true


# The package root holds the public entry modules and a few shared ones; helpers live in a
# sub-package of their floor (machine/, io/, models/ ...), so that the root stays readable.
ROOT_MODULES_MAX = 14


def root_crowding(package: Path) -> str | None:
    """Why the package root holds too many modules (besides ``__init__.py``), or None."""
    found = sorted(f.stem for f in package.glob("*.py") if f.name != "__init__.py")
    if len(found) <= ROOT_MODULES_MAX:
        return None
    return (f"mlmt_bench/ holds {len(found)} modules, at most {ROOT_MODULES_MAX}: move one into the sub-package of "
            f"its floor (docs/architecture.md): {', '.join(found)}")


def test_the_root_holds_at_most_14_modules():
    assert (PACKAGE / "cli.py").is_file()  # the check looks at the package
    assert root_crowding(PACKAGE) is None, root_crowding(PACKAGE)


def test_the_root_check_fails_on_a_15th_module(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    for i in range(ROOT_MODULES_MAX):
        (tmp_path / f"m{i:02d}.py").write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.py").write_text("")  # a sub-package's module is not the root's
    assert root_crowding(tmp_path) is None
    (tmp_path / "extra.py").write_text("")
    assert root_crowding(tmp_path) == ("mlmt_bench/ holds 15 modules, at most 14: move one into the sub-package of "
                                       "its floor (docs/architecture.md): extra, " +
                                       ", ".join(f"m{i:02d}" for i in range(14)))


def test_the_floor_check_finds_an_upward_import():
    graph = {"mlmt_bench.models.policy": {"mlmt_bench.trainer"}, "mlmt_bench.trainer": {"mlmt_bench.models.policy"},
             "mlmt_bench.metrics.cost": {"mlmt_bench.rollout.backend"}, "mlmt_bench.attic.x": set()}
    assert floor_violations(graph) == [
        "attic (mlmt_bench.attic.x) stands on no floor: add it to FLOORS",
        "mlmt_bench.metrics.cost -> mlmt_bench.rollout.backend (components -> components)",
        "mlmt_bench.models.policy -> mlmt_bench.trainer (components -> training)",
    ]


def test_the_check_finds_a_cycle_when_there_is_one(tmp_path, monkeypatch):
    """Two modules that import each other (one lazily, inside a function) are reported."""
    pkg = tmp_path / "mlmt_bench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from mlmt_bench import b\n")
    (pkg / "b.py").write_text("def f():\n    import mlmt_bench.a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mlmt_bench import a\n")
    monkeypatch.setitem(globals(), "PACKAGE", pkg)
    modules = _modules()
    graph = {m: _imports(p, modules) for m, p in modules.items()}
    assert graph["mlmt_bench.c"] == set()  # annotations only: not a dependency
    assert find_cycles(graph) == [["mlmt_bench.a", "mlmt_bench.b", "mlmt_bench.a"]]


def _test_modules_imported(path: Path, test_modules: set[str]) -> list[str]:
    """The test modules (``test_*``) that the file ``path`` imports, lazily or not."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return sorted({m for m in found if m.split(".")[0] in test_modules})


def test_no_test_module_imports_another(tmp_path):
    """A test module is not a library: what several use lives in tests/support.py (helpers) and
    tests/conftest.py (fixtures; a fixture imported from a test module is shadowed by the test
    arguments that request it)."""
    tests = Path(__file__).resolve().parent
    test_modules = {f.stem for f in tests.glob("test_*.py")}
    assert len(test_modules) > 40 and "test_architecture" in test_modules  # the scan sees the suite
    offenders = {f.name: got for f in sorted(tests.rglob("*.py")) if (got := _test_modules_imported(f, test_modules))}
    assert not offenders, offenders
    bad = tmp_path / "test_x.py"
    bad.write_text("def test():\n    from test_architecture import find_cycles\n")
    assert _test_modules_imported(bad, test_modules) == ["test_architecture"]  # the check sees a lazy import
