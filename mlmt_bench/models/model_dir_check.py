"""A model directory from elsewhere, checked before a library loads it (``mlmt-bench eval``).

transformers and peft read whatever a directory holds: a pickle ``pytorch_model.bin`` (through
torch's restricted unpickler, a long traceback when it refuses), a ``model.safetensors`` that is a
link to ``/dev/zero``, a ``config.json`` whose ``vocab_size`` of 2^40 sizes an embedding of
petabytes, an adapter whose base is ``/etc``. :func:`check_model_dir` refuses each in one
:class:`~mlmt_bench.errors.UserError` line before anything is loaded, reading only bounded JSON
files and the safetensors headers (never a tensor, never a pickle):

- ``config.json`` / ``adapter_config.json``: regular files, a bounded JSON object
  (:func:`mlmt_bench.io.bounded_input.read_json`);
- every file in the directory is a regular file (after links: a hub cache's snapshot links to
  its blobs are fine; a device, FIFO or socket is not);
- the weights are safetensors (``*.safetensors``; sharded ones through their index, whose file
  names are plain names in the directory); a directory whose only weights are pickle files is
  refused;
- ``vocab_size`` x ``hidden_size`` (the input embedding's elements) is at most the number of
  elements the weights hold: a config cannot size a model larger than its weights;
- an adapter's ``base_model_name_or_path`` is a hub id (``org/name``: what the hub serves is the
  hub's) or a local directory that passes these checks itself.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from mlmt_bench.errors import UserError
from mlmt_bench.io import bounded_input

#: file suffixes whose loading unpickles (runs code, or needs torch's restricted unpickler)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
#: a hub model id: ``name`` or ``org/name`` (the hub's own character set)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]{0,95}(/[\w.\-]{1,96})?\Z")


def check_model_dir(model_dir: Path | str, *, _depth: int = 0) -> None:
    """A one-line UserError unless ``model_dir`` (an HF model or peft adapter directory) passes
    the module's checks; nothing is loaded."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise UserError(f"{model_dir}: not a directory")
    adapter, config_path = model_dir / "adapter_config.json", model_dir / "config.json"
    if not os.path.lexists(adapter) and not os.path.lexists(config_path):
        raise UserError(f"{model_dir}: not a model directory (no config.json or adapter_config.json)")
    _check_entries(model_dir)
    if os.path.lexists(adapter):
        _check_adapter(model_dir, _json_object(adapter), _depth)
        return
    config = _json_object(config_path)
    n_elements = _weights_elements(model_dir, "model")
    embedding = _embedding_elements(config)
    if embedding is not None and embedding > n_elements:
        raise UserError(f"{config_path}: vocab_size x hidden_size is {embedding:,} embedding weights, more than the "
                        f"{n_elements:,} its safetensors weights hold; refused")


def _check_entries(model_dir: Path) -> None:
    """Every entry of ``model_dir`` that is not a directory is a regular file (links followed)."""
    try:
        entries = sorted(os.scandir(model_dir), key=lambda e: e.name)
    except OSError as exc:
        raise UserError(f"{model_dir}: cannot read ({exc.strerror or exc})") from None
    for entry in entries:
        path = Path(entry.path)
        try:
            if os.path.isdir(path):
                continue
        except (OSError, ValueError):
            pass
        bounded_input.check_regular_file(path)


def _json_object(path: Path) -> dict[str, Any]:
    value = bounded_input.read_json(path)
    if not isinstance(value, dict):
        raise UserError(f"{path}: not a JSON object")
    return value


def _weights_elements(model_dir: Path, stem: str) -> int:
    """The number of tensor elements in ``model_dir``'s safetensors weights (their headers only);
    one line when there are none (and when the only weights are pickle files)."""
    index = model_dir / f"{stem}.safetensors.index.json"
    if os.path.lexists(index):
        weight_map = _json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"{index}: no weight_map")
        names = set(weight_map.values())
        bad = sorted(str(n) for n in names if not isinstance(n, str) or Path(n).name != n or n in ("", ".", ".."))
        if bad:
            raise UserError(f"{index}: a shard named {bounded_input.echo(bad[0])} is not a file name in "
                            f"{model_dir}; refused")
        files = [model_dir / n for n in sorted(names)]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in model_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise UserError(f"{model_dir}: its weights are {', '.join(pickles[:3])}, pickle files (loading a pickle "
                            "can run code); refused: save the model as safetensors")
        raise UserError(f"{model_dir}: no safetensors weights ({stem}.safetensors)")
    return sum(_header_elements(f) for f in files)


def _header_elements(path: Path) -> int:
    from safetensors import safe_open

    bounded_input.check_regular_file(path)
    try:
        total = 0
        with safe_open(str(path), framework="pt", device="cpu") as st:
            for key in st.keys():
                total += math.prod(st.get_slice(key).get_shape())
        return total
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        why = bounded_input.shorten(bounded_input.unquoted(str(exc)), 120)
        raise UserError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {why})") from None


def _embedding_elements(config: dict[str, Any]) -> int | None:
    """``vocab_size * hidden_size`` of a config (or of its ``text_config``); None when it does
    not give both as integers."""
    for c in (config, config.get("text_config")):
        if isinstance(c, dict):
            vocab, hidden = c.get("vocab_size"), c.get("hidden_size", c.get("d_model", c.get("n_embd")))
            if isinstance(vocab, int) and isinstance(hidden, int) and not isinstance(vocab, bool):
                return max(vocab, 0) * max(hidden, 0)
    return None


def _check_adapter(adapter_dir: Path, config: dict[str, Any], depth: int) -> None:
    where = adapter_dir / "adapter_config.json"
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise UserError(f"{where}: no base_model_name_or_path; cannot tell which model the adapter is for")
    _weights_elements(adapter_dir, "adapter_model")
    local = Path(base).expanduser()
    if base.startswith(("/", ".", "~")) or os.path.lexists(local):
        if depth > 0:
            raise UserError(f"{where}: its base {bounded_input.echo_path(base)} is an adapter too; refused")
        if not local.is_dir():
            raise UserError(f"{where}: base_model_name_or_path {bounded_input.echo_path(base)} is not a directory")
        try:
            check_model_dir(local, _depth=depth + 1)
        except UserError as exc:  # the base's own line, said to be the base's
            raise UserError(f"{where}: its base is refused: {exc}") from None
        return
    if not _HUB_ID.match(base):
        raise UserError(f"{where}: base_model_name_or_path is neither a hub id (org/name) nor a local directory")
