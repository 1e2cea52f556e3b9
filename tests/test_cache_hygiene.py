"""A base build removes only its own abandoned temporary folders (issue 34, item 10): with
``MLMT_BENCH_CACHE`` a shared folder, another program's ``.tmp-<x>-<pid>-<y>`` is not its to delete."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mlmt_bench.warmstart import shared_base


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_this_users_own_abandoned_build_folders_are_removed(tmp_path: Path):
    dead = _dead_pid()
    key = "0123456789abcdef"
    ours = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-{dead}-", dir=tmp_path))
    alive = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-{os.getpid()}-", dir=tmp_path))
    others = [tmp_path / f".tmp-build-{dead}-cache", tmp_path / f".tmp-x-{dead}-y",
              tmp_path / f".tmp-{key[:8]}-{dead}-abcdefgh", tmp_path / f".tmp-{key}-{dead}"]
    for d in others:
        d.mkdir()
        (d / "their-file").write_text("not ours")
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / f".tmp-{key}-{dead}-abcdefgh"
    link.symlink_to(target, target_is_directory=True)
    shared_base._remove_abandoned(tmp_path)
    assert not ours.exists()  # a build of ours, killed: removed
    assert alive.is_dir()  # a build still running: kept
    assert all((d / "their-file").is_file() for d in others)  # not named as a build names it: kept
    assert link.is_symlink() and target.is_dir()  # a link is never followed or removed
