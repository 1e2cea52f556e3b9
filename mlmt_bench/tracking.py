"""Run directories: nothing written is ever lost or overwritten.

Layout of ``<output_dir>/<name>-<UTC timestamp>/``::

    spec.resolved.yaml   the validated spec, enough to reproduce the run
    manifest.json        git SHA, package versions, seed, host, start/end time, status
    metrics.jsonl        one JSON object per line, appended and flushed as produced
    samples.jsonl        full episodes (all turns, rewards, verdicts), appended and flushed
    checkpoints/step-N/  written under a temporary name and renamed when complete
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from mlmt_bench.errors import UserError

_TRACKED_PACKAGES = ("mlmt-bench", "torch", "transformers", "peft", "accelerate", "tokenizers",
                     "datasets", "optuna", "math-verify", "vllm", "trl")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file + rename, so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def git_sha(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).parent,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


class JsonlWriter:
    """Append-only JSON lines; each record is flushed to the OS as soon as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, ensure_ascii=False, default=_json_default) + "\n")
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            os.fsync(self._f.fileno())
            self._f.close()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def read_jsonl_lines(path: Path) -> list[tuple[int, Any]]:
    """(line number, record) of a JSONL file this module wrote; a torn last line (a crash
    mid-write) is ignored, any other bad line is a file:line UserError (:mod:`mlmt_bench.jsonl`)."""
    from mlmt_bench.jsonl import iter_jsonl

    return list(iter_jsonl(path, torn_tail_ok=True))


def read_jsonl(path: Path) -> list[Any]:
    """Records of a JSONL file (see :func:`read_jsonl_lines`)."""
    return [rec for _, rec in read_jsonl_lines(path)]


class RunDir:
    """One run's directory. Create with :meth:`create`, reopen for resume with :meth:`open`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self._metrics: JsonlWriter | None = None
        self._samples: JsonlWriter | None = None
        self._eval_problems: JsonlWriter | None = None

    @classmethod
    def create(cls, output_dir: Path | str, name: str, spec_yaml: str, seed: int) -> "RunDir":
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        for i in range(1000):  # mkdir is atomic: two runs started the same second get distinct dirs
            path = output_dir / (f"{name}-{stamp}" + (f"-{i}" if i else ""))
            try:
                path.mkdir()
                break
            except FileExistsError:
                continue
        else:
            raise UserError(f"{output_dir}: could not create a fresh run directory for {name}")
        run = cls(path)
        run.checkpoints.mkdir()
        atomic_write_text(path / "spec.resolved.yaml", spec_yaml)
        run.write_manifest({
            "name": name,
            "status": "running",
            "seed": seed,
            "start_time": utc_now(),
            "end_time": None,
            "git_sha": git_sha(),
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "argv": sys.argv,
            "versions": package_versions(),
        })
        return run

    @classmethod
    def open(cls, path: Path | str) -> "RunDir":
        path = Path(path)
        if not (path / "manifest.json").is_file() or not (path / "spec.resolved.yaml").is_file():
            raise UserError(f"{path}: not a run directory (no manifest.json / spec.resolved.yaml)")
        return cls(path)

    # manifest -------------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"{self.path / 'manifest.json'}: unreadable ({exc})") from None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        atomic_write_text(self.path / "manifest.json", json.dumps(manifest, indent=2, default=_json_default))

    def update_manifest(self, **fields: Any) -> None:
        m = self.manifest()
        m.update(fields)
        self.write_manifest(m)

    def finish(self, status: str) -> None:
        self.close()
        self.update_manifest(status=status, end_time=utc_now())

    # append-only logs -----------------------------------------------------------------------
    def log_metrics(self, record: dict[str, Any]) -> None:
        if self._metrics is None:
            self._metrics = JsonlWriter(self.path / "metrics.jsonl")
        self._metrics.write(record)

    def log_sample(self, record: dict[str, Any]) -> None:
        if self._samples is None:
            self._samples = JsonlWriter(self.path / "samples.jsonl")
        self._samples.write(record)

    def log_eval_problems(self, records: list[dict[str, Any]]) -> None:
        if self._eval_problems is None:
            self._eval_problems = JsonlWriter(self.path / "eval_problems.jsonl")
        for r in records:
            self._eval_problems.write(r)

    def metrics(self) -> list[dict[str, Any]]:
        path = self.path / "metrics.jsonl"
        return read_jsonl(path) if path.exists() else []

    def truncate_logs_after(self, step: int) -> None:
        """On resume: drop log lines written after the checkpoint at ``step`` (they will be redone)."""
        for name in ("metrics.jsonl", "samples.jsonl", "eval_problems.jsonl"):
            path = self.path / name
            if not path.exists():
                continue
            kept = [r for r in read_jsonl(path) if r.get("step", -1) <= step]
            atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))

    def close(self) -> None:
        for w in (self._metrics, self._samples, self._eval_problems):
            if w is not None:
                w.close()
        self._metrics = self._samples = self._eval_problems = None

    # checkpoints ----------------------------------------------------------------------------
    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints / f"step-{step:06d}"

    def begin_checkpoint(self, step: int) -> Path:
        """A temporary directory to fill; :meth:`commit_checkpoint` renames it into place."""
        tmp = self.checkpoints / f".tmp-step-{step:06d}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, tmp: Path, step: int) -> Path:
        final = self.checkpoint_dir(step)
        if final.exists():
            old = final.with_name(final.name + ".old")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
        return final

    def latest_checkpoint(self) -> Path | None:
        done = sorted(p for p in self.checkpoints.glob("step-*") if p.is_dir() and not p.name.endswith(".old"))
        return done[-1] if done else None

    def iter_checkpoints(self) -> Iterator[Path]:
        yield from sorted(p for p in self.checkpoints.glob("step-*") if p.is_dir())
