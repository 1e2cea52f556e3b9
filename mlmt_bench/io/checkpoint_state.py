"""A checkpoint's trainer state without pickle: one safetensors file, the tensors as tensors and
everything else as JSON in its metadata.

Written here because the libraries' own checkpoints pickle what is not a tensor (``torch.save`` of
an optimizer's state, ``accelerate``'s ``save_state`` of the RNG states), and safetensors holds
tensors only: the rest has to be put into its metadata and read back as plain values by someone.

:func:`save_state` writes ``trainer_state.safetensors``; :func:`load_state` reads it back
exactly (dtypes, shapes, the device each tensor was on when that device exists here; tuples
stay tuples, integer dict keys stay integers, numpy arrays come back as numpy arrays of their
dtype), so a resumed run continues bit for bit. A run directory may come from someone else
(ARCHITECTURE.md, "Untrusted data stays data"): reading this file executes nothing, since a
safetensors file is a JSON header and raw tensor bytes, and the JSON is decoded into plain
values only. It is read from a regular file only, its JSON within ``MAX_STATE_JSON_BYTES``.

:func:`check_state` and :func:`check_weights` say whether a checkpoint is intact, i.e. holds
what resuming reads, before anything is loaded into a trainer (so a resume can skip a corrupt
checkpoint for an older one).

A checkpoint from before this format holds ``trainer_state.pt`` (a pickle): it is read with
``torch.load(weights_only=True)``, torch's restricted unpickler, allowing beyond tensors and
builtin containers only what numpy's RNG state needs (an ``ndarray`` of ``uint32``). Anything
else in it (a class whose ``__reduce__`` runs a command ...) is a one-line error, not a call.
"""

from __future__ import annotations

import json
import os
import re
import stat
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mlmt_bench.errors import UserError

STATE_FILE = "trainer_state.safetensors"
LEGACY_FILE = "trainer_state.pt"
MAX_STATE_JSON_BYTES = 64 << 20
_META_KEY = "mlmt_state"
_TAGS = ("__tensor__", "__tuple__", "__dict__", "__ndarray__")


def save_state(directory: Path, state: Any) -> Path:
    """Write ``state`` (nested dicts, lists, tuples, numbers, strings, None, tensors, numpy
    arrays) to ``directory / STATE_FILE``; TypeError on any other value."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    seen_storage: set[int] = set()

    def enc(value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, torch.Tensor):
            t = value.detach()
            device = str(t.device)
            t = t.cpu().contiguous()
            ptr = t.untyped_storage().data_ptr() if t.numel() else None
            if ptr is not None and ptr in seen_storage:  # safetensors refuses tensors sharing memory
                t = t.clone()
            elif ptr is not None:
                seen_storage.add(ptr)
            name = f"t{len(tensors)}"
            tensors[name] = t
            return {"__tensor__": name, "device": device}
        if isinstance(value, np.ndarray) or isinstance(value, np.generic):
            arr = np.asarray(value)
            if arr.dtype.kind not in "biuf":
                raise TypeError(f"numpy array of dtype {arr.dtype} cannot be stored")
            return {"__ndarray__": arr.tolist(), "dtype": arr.dtype.str, "shape": list(arr.shape),
                    "scalar": isinstance(value, np.generic)}
        if isinstance(value, tuple):
            return {"__tuple__": [enc(v) for v in value]}
        if isinstance(value, list):
            return [enc(v) for v in value]
        if isinstance(value, dict):
            if all(isinstance(k, str) and k not in _TAGS for k in value):
                return {k: enc(v) for k, v in value.items()}
            return {"__dict__": [[enc(k), enc(v)] for k, v in value.items()]}
        raise TypeError(f"{type(value).__name__} cannot be stored in a checkpoint's trainer state")

    meta = json.dumps(enc(state), allow_nan=True, separators=(",", ":"))
    path = Path(directory) / STATE_FILE
    save_file(tensors, str(path), metadata={_META_KEY: meta})
    return path


def load_state(directory: Path) -> Any:
    """The state :func:`save_state` wrote in ``directory`` (or a legacy ``trainer_state.pt``);
    a one-line UserError for a missing, foreign or corrupt file."""
    directory = Path(directory)
    path = directory / STATE_FILE
    if not os.path.lexists(path):
        if os.path.lexists(directory / LEGACY_FILE):
            return _load_legacy(directory / LEGACY_FILE)
        raise UserError(f"{directory}: no {STATE_FILE} (not a complete checkpoint)")
    _check_regular(path)
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = (f.metadata() or {}).get(_META_KEY)
            if meta is None:
                raise ValueError(f"no {_META_KEY!r} metadata")
            if len(meta) > MAX_STATE_JSON_BYTES:
                raise ValueError(f"state of more than {MAX_STATE_JSON_BYTES >> 20} MiB")
            names = set(f.keys())
            tensors = {name: f.get_tensor(name) for name in names}
        raw = json.loads(meta)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise UserError(f"{path}: unreadable checkpoint state ({type(exc).__name__}: {_short(exc)})") from None
    try:
        return _decode(raw, tensors)
    except (KeyError, TypeError, ValueError, RecursionError, OverflowError) as exc:
        raise UserError(f"{path}: malformed checkpoint state ({type(exc).__name__}: {_short(exc)})") from None


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def os_error_of(exc: BaseException) -> OSError | None:
    """The OSError inside a safetensors error (its Rust I/O error names the errno as ``(os error
    28)``), so that a full disk while weights are written is the run's one ``no space left`` line,
    not a 55-line traceback; None for any other exception."""
    from safetensors import SafetensorError

    if isinstance(exc, OSError):
        return exc
    m = _OS_ERROR.search(str(exc)) if isinstance(exc, SafetensorError) else None
    if m is None:
        return None
    code = int(m.group(1))
    return OSError(code, os.strerror(code))


def recorded_step(directory: Path) -> int | None:
    """The step the trainer state in ``directory`` was saved at (its ``counters.step``), read from
    the file's metadata alone (no tensor is loaded); None when it cannot be read."""
    from safetensors import safe_open

    class _NoTensors(dict[str, Any]):
        def __missing__(self, key: str) -> None:
            return None

    path = Path(directory) / STATE_FILE
    try:
        _check_regular(path)
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = (f.metadata() or {}).get(_META_KEY)
        if meta is None or len(meta) > MAX_STATE_JSON_BYTES:
            return None
        state = _decode(json.loads(meta), _NoTensors())
        step = state["counters"]["step"]
    except Exception:  # noqa: BLE001 - anything unreadable is "unknown", for the caller to skip
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


STATE_KEYS = ("counters", "optimizers", "algorithm", "rng")


def check_state(directory: Path, state: Any) -> None:
    """UserError unless ``state`` has what resuming reads: the four sections, ``counters`` and
    ``optimizers`` as mappings, ``rng`` with the torch, python and numpy streams."""
    ok = (isinstance(state, dict) and all(k in state for k in STATE_KEYS)
          and isinstance(state["counters"], dict) and isinstance(state["optimizers"], dict)
          and isinstance(state["rng"], dict) and all(k in state["rng"] for k in ("torch", "python", "numpy")))
    if not ok:
        raise UserError(f"{Path(directory) / STATE_FILE}: incomplete checkpoint state (it needs "
                        f"{', '.join(STATE_KEYS)} and the torch / python / numpy RNG states)")
    import math
    import random

    from mlmt_bench.io.bounded_input import is_name

    def finite(v: Any) -> bool:
        try:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        except OverflowError:  # an int too large for a float
            return False

    counters = state["counters"]
    bad = [k for k, v in counters.items() if not finite(v)]
    step = counters.get("step", 0)
    if bad or not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 2 ** 53:
        names = ", ".join(k if is_name(k) else "(a key not shown)" for k in bad[:3]) or "step"
        raise UserError(f"{Path(directory) / STATE_FILE}: malformed checkpoint state (counters: {names} must be "
                        "finite numbers, the step a whole number)")
    rng = state["rng"]
    for name, load in (("torch", lambda s: torch.Generator().set_state(s)), ("python", random.Random().setstate),
                       ("numpy", np.random.RandomState().set_state)):
        try:  # on a scratch generator: a resume sets them only after everything else is loaded
            load(rng[name])
        except Exception:  # noqa: BLE001 - TypeError, ValueError, RuntimeError: each library its own
            raise UserError(f"{Path(directory) / STATE_FILE}: malformed checkpoint state (rng.{name} is not a "
                            f"{name} RNG state)") from None


def check_weights(directory: Path, lora: bool) -> None:
    """UserError unless ``directory`` holds the weights a policy's ``load_weights`` reads
    (``adapter_model.safetensors`` for LoRA, else at least one ``*.safetensors``), each a regular
    file whose header parses and whose size covers every tensor (a truncated file fails)."""
    from safetensors import safe_open

    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"{directory}: missing (the policy's weights)")
    files = [directory / "adapter_model.safetensors"] if lora else sorted(directory.glob("*.safetensors"))
    if not files or not os.path.lexists(files[0]):
        raise UserError(f"{directory}: no {'adapter_model.safetensors' if lora else '*.safetensors'} weights")
    for path in files:
        _check_regular(path)
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                f.keys()
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
            raise UserError(f"{path}: unreadable weights ({type(exc).__name__}: {_short(exc)})") from None


def _decode(raw: Any, tensors: dict[str, torch.Tensor]) -> Any:
    def dec(value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, list):
            return [dec(v) for v in value]
        if not isinstance(value, dict):
            raise TypeError(f"unexpected {type(value).__name__}")
        if "__tensor__" in value:
            t = tensors[value["__tensor__"]]
            device = value.get("device", "cpu")
            if isinstance(device, str) and device != "cpu" and _device_available(device):
                t = t.to(device)
            return t
        if "__tuple__" in value:
            return tuple(dec(v) for v in _list(value["__tuple__"]))
        if "__dict__" in value:
            return {_hashable(dec(k)): dec(v) for k, v in (_pair(p) for p in _list(value["__dict__"]))}
        if "__ndarray__" in value:
            dtype = np.dtype(str(value["dtype"]))
            if dtype.kind not in "biuf":
                raise ValueError(f"numpy dtype {dtype} is not allowed")
            arr = np.array(value["__ndarray__"], dtype=dtype).reshape([int(n) for n in _list(value["shape"])])
            return arr[()] if value.get("scalar") else arr
        return {k: dec(v) for k, v in value.items()}

    return dec(raw)


def _list(value: Any) -> list:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _pair(value: Any) -> tuple[Any, Any]:
    if not isinstance(value, list) or len(value) != 2:
        raise TypeError("expected a [key, value] pair")
    return value[0], value[1]


def _hashable(key: Any) -> Any:
    hash(key)  # TypeError for a list / dict key
    return key


def _device_available(device: str) -> bool:
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        return False
    if d.type == "cuda":
        return torch.cuda.is_available() and (d.index or 0) < torch.cuda.device_count()
    return d.type == "cpu"


def _short(exc: BaseException) -> str:
    """``exc``'s message, short, without the pieces of the file it quotes (``int('<value>')``)."""
    from mlmt_bench.io.bounded_input import shorten, unquoted

    return shorten(unquoted(str(exc)).replace("\n", " "), 160)


def _check_regular(path: Path) -> None:
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UserError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{path}: not a regular file (a link, device or FIFO), refused")


def _load_legacy(path: Path) -> Any:
    """A ``trainer_state.pt`` of an older checkpoint, through torch's restricted unpickler."""
    _check_regular(path)
    allowed: list[Callable[..., Any] | tuple[Callable[..., Any], str]] = [np.ndarray, np.dtype,
                                                                          type(np.dtype(np.uint32))]
    core = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1
    reconstruct = getattr(core.multiarray, "_reconstruct", None)
    if reconstruct is not None:
        allowed.append(reconstruct)
    try:
        with torch.serialization.safe_globals(allowed), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Detected pickle protocol 4 ..."
            return torch.load(path, weights_only=True, map_location=None)
    except Exception as exc:  # noqa: BLE001 - UnpicklingError, RuntimeError (not a zip) ...
        why = _unpickler_reason(exc)
        raise UserError(f"{path}: refused, not loaded (not plain checkpoint data: {_short(Exception(why))}; "
                        "a pickle of anything else could run code)") from None


def _unpickler_reason(exc: BaseException) -> str:
    """The one line of a ``weights_only`` refusal that says what was refused ("Unsupported
    global: GLOBAL posix.system", "Trying to load unsupported GLOBAL ..."), without torch's advice."""
    text = str(exc)
    if not text.startswith("Weights only load failed"):
        return f"{type(exc).__name__}: {text}"
    for para in (p.strip() for p in text.split("\n\n")[1:]):
        if not para or para.startswith(("Check the documentation", "(1)", "(2)", "\t")):
            continue
        line = para.split("\n", 1)[0].removeprefix("WeightsUnpickler error: ")
        for cut in (" was not an allowed global", ". Please use"):
            line = line.split(cut, 1)[0]
        return line
    return "refused by torch's weights_only unpickler"
