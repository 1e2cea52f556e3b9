"""The sandbox's judge runs from a zip archive in a memfd (``python -I -S -B /dev/fd/N``) and
closes that descriptor before it forks: so the package ``verifiers/sandbox/judge/`` may import
only the standard library and itself, and every one of its modules must be imported when the
judge starts (one imported later would be looked for in a closed descriptor, or in a jail that
shows none of them)."""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import zipfile
from pathlib import Path

from mlmt_bench.verifiers import sandbox

JUDGE = Path(sandbox.__file__).with_name("judge")


def _absolute_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_judge_imports_only_the_standard_library_and_itself():
    modules = sorted(JUDGE.glob("*.py"))
    assert len(modules) >= 8, modules
    for path in modules:
        outside = _absolute_imports(path) - set(sys.stdlib_module_names) - {"__future__"}
        assert not outside, (path.name, outside)


def test_the_checker_sees_an_import_from_outside(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\ndef f():\n    from mlmt_bench.errors import UserError\n    import numpy\n")
    assert _absolute_imports(bad) - set(sys.stdlib_module_names) == {"mlmt_bench", "numpy"}


def test_the_archive_holds_every_judge_module_compiled_and_the_judge_imports_them_all_at_start(tmp_path):
    data = sandbox._judge_archive()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    expected = {f"_sandbox_judge/{p.stem}.pyc" for p in JUDGE.glob("*.py")}
    assert set(names) == expected | {"__main__.py"}, names
    archive = tmp_path / "judge.zip"
    archive.write_bytes(data)
    main = zipfile.ZipFile(archive).read("__main__.py").decode()
    assert "from _sandbox_judge.supervisor import judge_main\n" in main, main
    loaded = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c",
         f"import sys; sys.path.insert(0, {str(archive)!r}); import _sandbox_judge.supervisor; "
         "print(' '.join(m for m in sys.modules if m.startswith('_sandbox_judge')))"],
        capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert set(loaded) == {"_sandbox_judge"} | {f"_sandbox_judge.{p.stem}" for p in JUDGE.glob("*.py")
                                               if p.stem != "__init__"}, loaded
