"""How the evaluator E turns a test into trusted code: every candidate-dependent sub-expression
becomes a remote call.

:func:`judge_setup` gives E's trusted namespace from the setup (its stdlib imports and plain
literals) and the names only C has; :func:`prepare_test` rewrites one test (``assert f(3) == 5``)
so that each sub-expression rooted at a name E cannot resolve (``f(3)``) is sent to C as source
text (``__mlmt_remote__(index, free local values)``), while the comparison, the ``assert`` and
helper calls stay in E. Standard library only (see the package docstring).
"""

from __future__ import annotations

import ast
import builtins
import sys

# stdlib modules E must never import on a test's behalf (side effects on import)
_NO_IMPORT = frozenset({
    "antigravity", "this", "turtle", "turtledemo", "tkinter", "idlelib", "webbrowser", "pydoc",
    "lib2to3", "ensurepip", "venv", "pdb", "code", "site", "sitecustomize", "usercustomize",
})


def _root_name(node):
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _bound_names(tree) -> set[str]:
    """Names a piece of code binds anywhere (assignment targets, loop / comprehension variables,
    lambda and function arguments, imports, except-as, defs)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                out.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
        elif isinstance(node, ast.MatchAs) and node.name:
            out.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            out.update(node.names)
    return out


def top_level_defs(program: str) -> set[str]:
    try:
        tree = ast.parse(program)
    except BaseException:  # noqa: BLE001
        return set()
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.add(n.id)
    return out


class _Rewriter(ast.NodeTransformer):
    def __init__(self, remote: set[str], local: set[str], table: list) -> None:
        self.remote = remote
        self.local = local
        self.table = table

    def visit(self, node):
        if isinstance(node, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)):
            ctx = getattr(node, "ctx", None)
            if (ctx is None or isinstance(ctx, ast.Load)) and _root_name(node) in self.remote:
                return self._remote(node)
        return self.generic_visit(node)

    def _remote(self, node):
        inner_bound = _bound_names(node)
        free = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
                      & self.local - inner_bound)
        self.table.append(ast.unparse(node))
        call = ast.Call(
            func=ast.Name("__mlmt_remote__", ast.Load()),
            args=[ast.Constant(len(self.table) - 1),
                  ast.Dict(keys=[ast.Constant(n) for n in free], values=[ast.Name(n, ast.Load()) for n in free])],
            keywords=[])
        return ast.copy_location(call, node)


def judge_setup(setup: str) -> tuple[dict, set[str]]:
    """J's trusted namespace from the setup, and the names only C has.

    The setup runs in C (after the program: MBPP's ``root = Node(1)`` needs the program's class),
    so what it binds is candidate-controlled there. J itself takes only the setup's stdlib
    imports and its plain-literal assignments (``expected = [1, 2]``, via ``ast.literal_eval``);
    tests then use J's copies. Every other name the setup binds is "C only": a test's use of it
    is evaluated in C, like a call to the program (fine for inputs, not for expected values).
    """
    ns: dict = {"__builtins__": builtins, "__name__": "__judge__"}
    c_only: set[str] = set()
    try:
        tree = ast.parse(setup or "")
    except BaseException:  # noqa: BLE001 - C reports the setup's syntax error
        return ns, c_only
    for node in tree.body:
        bound = _bound_names(node)
        done = False
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if all(m.split(".")[0] in sys.stdlib_module_names and m.split(".")[0] not in _NO_IMPORT
                   for m in mods) and not getattr(node, "level", 0):
                try:
                    exec(compile(ast.Module([node], []), "<setup-imports>", "exec"), ns)  # noqa: S102
                    done = True
                except Exception:  # noqa: BLE001
                    pass
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
                for t in node.targets:
                    assert isinstance(t, ast.Name)  # every target is one (the elif above)
                    ns[t.id] = value
                done = True
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass
        if done:
            c_only -= bound
        else:
            c_only |= bound
            for name in bound:
                ns.pop(name, None)
    return ns, c_only


def prepare_test(test: str, ns: dict, setup_bound: set[str], program_defs: set[str], table: list):
    """Rewrite one test so that every candidate-dependent sub-expression becomes a remote call.

    A name is remote when J cannot resolve it: not a builtin, not a stdlib module, not imported
    by the setup, bound by the setup's own statements (e.g. MBPP's ``root = Node(1)``). A test
    whose names are all builtins (MBPP 126 asks for a function called ``sum``) sends the names
    the program defines at top level instead.
    """
    tree = ast.parse(test, "<test>", "exec")
    local = _bound_names(tree)
    loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for name in loaded - local:
        if name not in ns and name not in setup_bound and name in sys.stdlib_module_names \
                and name not in _NO_IMPORT and not hasattr(builtins, name):
            try:
                ns[name] = __import__(name)
            except Exception:  # noqa: BLE001
                pass

    def trusted(name: str) -> bool:
        return name not in setup_bound and (name in ns or hasattr(builtins, name))

    remote = {n for n in loaded - local if not trusted(n)}
    if not remote:
        remote = (loaded - local) & program_defs
    new = _Rewriter(remote, local, table).visit(tree)
    ast.fix_missing_locations(new)
    return compile(new, "<test>", "exec")
