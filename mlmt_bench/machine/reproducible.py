"""The same float results on machines of one CPU vendor: the CPU pin, its record, and weight hashes.

Not across vendors: pinned alike, an Intel Xeon (Sapphire Rapids, AVX-512 and AMX) and an AMD EPYC
train different weights from the same seed (measured 2026-12-03 on the default shared base at
150 SFT steps: sha256 36245e0d… on the Xeon with 1 or 2 threads, 94e33caf… on the EPYC;
``MKL_ENABLE_INSTRUCTIONS=AVX2``, ``ONEDNN_MAX_CPU_ISA=AVX2``, ``MKL_CBWR=COMPATIBLE,STRICT`` and
masking glibc's AVX-512 and AMX capabilities change nothing on the Xeon), so each run records
the CPU, and a base meant to be the same everywhere ships as weights
(:mod:`mlmt_bench.warmstart.shipped_bases`).

Two things make a CPU's float results depend on the machine at a fixed seed and thread count
(/work/shared/REPRODUCIBILITY.md, measured): torch's kernel dispatch (vector width, hence the
summation order of reductions and fused kernels: ``ATEN_CPU_CAPABILITY``) and MKL's code path
for SGEMM, the only BLAS routine these models call (``MKL_CBWR``). Both are read when the
libraries load, so :func:`apply` puts :data:`PIN` into the environment before ``import torch``
(the console entry point calls it first), re-executing the process when torch is already
loaded; spawned workers (``--workers``, sweeps, accelerate) inherit the environment.

The levels (measured by ``perf/cpu_pin_cost.py``):

- ``ATEN_CPU_CAPABILITY=avx2``: every x86-64 CPU of the last decade has AVX2 (Intel since
  Haswell, 2013; AMD since Excavator, 2015); AVX-512 CPUs then run the same AVX2 kernels.
- ``MKL_CBWR=COMPATIBLE``: MKL's conditional-reproducibility SSE2 path. It is the only branch
  MKL honours on non-Intel CPUs: any other (``AVX2`` included) silently becomes ``AUTO`` there,
  whose code path still depends on the CPU (checked here: ``mkl_serv_cbwr_get`` reports AUTO
  for ``MKL_CBWR=AVX2`` on an AMD EPYC).

``MLMT_BENCH_CPU_PIN=0`` switches the pin off (the run is then recorded as unpinned).
:func:`record` says what was in effect; a CPU without AVX2 cannot honour the pin and is
recorded as unpinned with the reason.

Only where it buys something: the pin makes weights *made here from a seed* (the shared base,
tiny models) the same on every machine of a vendor. A pretrained model's weights come from a
checkpoint, and the pin only slows it down: measured 2026-12-04 on a 2-core AMD EPYC
(``perf/pin_cost.py``, SmolLM2-135M generate, one thread), 1.7x the CPU time in generation, nearly all
of it ``MKL_CBWR=COMPATIBLE``'s SSE2 SGEMM; issue 32 measured 1.7x on a GRPO step and 2.4x in
generation on a Xeon. So ``mlmt-bench run`` decides from the spec (a model factory's
``needs_cpu_pin``) and calls ``apply(needed=False, ...)`` when every model loads from a
checkpoint: the process is then unpinned, recorded with the reason (:data:`NOT_NEEDED`, which
its children inherit), unless ``MLMT_BENCH_CPU_PIN=1`` (or true/yes/on) forces the pin, which
says so in one line.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: What the pin sets (before torch loads).
PIN: dict[str, str] = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}
#: ``MLMT_BENCH_CPU_PIN=0`` (or false/no/off) switches the pin off.
SWITCH = "MLMT_BENCH_CPU_PIN"
#: Set in a process that needs no pin (every model loads pretrained weights from a checkpoint): why.
#: Its children inherit it, and :func:`record` reports it.
NOT_NEEDED = "MLMT_BENCH_CPU_PIN_NOT_NEEDED"
#: Set for the re-executed process only: a second re-exec is never attempted.
_REEXEC = "MLMT_BENCH_CPU_PIN_REEXEC"
#: What the libraries report when the pin took: torch's dispatch level and MKL's CNR branch.
_EXPECTED = {"cpu_capability": "AVX2", "mkl_cbwr_branch": "COMPATIBLE"}
#: ``mkl_cbwr_get(MKL_CBWR_BRANCH)`` values (mkl_cbwr.h).
_MKL_BRANCHES = {0: "OFF", 1: "BRANCH_OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
                 8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1",
                 14: "AVX512_E1"}


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the pin is on (it is unless ``MLMT_BENCH_CPU_PIN`` is 0, false, no or off)."""
    env = os.environ if env is None else env
    return env.get(SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def forced(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``MLMT_BENCH_CPU_PIN`` asks for the pin even where it is not needed (1, true, yes or on)."""
    env = os.environ if env is None else env
    return env.get(SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def in_environment() -> bool:
    """Whether this process's environment holds the pin (set before torch loaded, it is in effect)."""
    return all(os.environ.get(k) == v for k, v in PIN.items())


def pinned_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the pin applied, unless it switches the pin off."""
    out = dict(os.environ if env is None else env)
    if enabled(out):
        out.update(PIN)
    return out


def apply(needed: bool = True, why_not: str = "") -> None:
    """Put the pin into this process's environment before torch loads (call it first thing).

    Nothing to do when the pin is off or already in place. Before ``import torch`` the
    environment is set in place; after it (the libraries may have read the old values), the
    process re-executes itself with the pinned environment, once: a process that was already
    re-executed and still differs continues, warns, and is recorded as unpinned.

    ``needed=False`` (``why_not``: why, e.g. every model loads from a checkpoint): the pin is
    left out and :data:`NOT_NEEDED` records why, unless ``MLMT_BENCH_CPU_PIN=1`` forces it (then
    one note says what it costs). A pin that was in the environment before (a parent's) stays,
    with a note."""
    from mlmt_bench.io.notes import note

    if not needed and enabled():
        if forced():
            note(f"the CPU pin is on (MLMT_BENCH_CPU_PIN={os.environ.get(SWITCH)}) though {why_not}: "
                 "bit-identical floats on machines of one CPU vendor, at a cost (a real model's generation "
                 "measured 1.7-2.4x slower)")
        else:
            os.environ.pop(_REEXEC, None)
            os.environ[NOT_NEEDED] = why_not or "not needed"
            if in_environment():
                note(f"the CPU pin ({', '.join(f'{k}={v}' for k, v in PIN.items())}) was in the environment before "
                     f"this process started, though {why_not}: it stays on (a real model's generation measured "
                     "1.7-2.4x slower); unset those variables to run unpinned")
            return
    os.environ.pop(NOT_NEEDED, None)
    reexeced = os.environ.pop(_REEXEC, None)
    if not enabled() or in_environment():
        return
    if "torch" not in sys.modules:
        os.environ.update(PIN)
        return
    if reexeced:
        from mlmt_bench.io.notes import warn

        warn("the CPU pin could not be applied (torch was loaded before it); this process is recorded as unpinned")
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**pinned_env(), _REEXEC: "1"})


def child_env() -> dict[str, str]:
    """What a process started elsewhere (a Ray task) needs in its environment to compute as this
    one: the pin, or what switched it off, or why it is not needed."""
    if not enabled():
        return {SWITCH: os.environ.get(SWITCH, "0")}
    if not in_environment() and os.environ.get(NOT_NEEDED):
        return {NOT_NEEDED: os.environ[NOT_NEEDED]}
    return dict(PIN)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mkl() -> dict[str, Any]:
    """MKL's version and the CNR branch in effect, from the library torch links (empty without MKL)."""
    import ctypes

    import torch

    if not torch.backends.mkl.is_available():
        return {}
    out: dict[str, Any] = {}
    match = re.search(r"Math Kernel Library Version ([\d.]+)\S*(?: Build (\d+))?", torch.__config__.show())
    if match:
        out["mkl"] = match.group(1) + (f" (build {match.group(2)})" if match.group(2) else "")
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        get = lib.mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return out
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    value = get(-1)  # MKL_CBWR_ALL: the branch and the STRICT flag (0x10000)
    out["mkl_cbwr_branch"] = _MKL_BRANCHES.get(value & 0xFFFF, str(value & 0xFFFF)) + (
        ",STRICT" if value & 0x10000 else "")
    return out


def record() -> dict[str, Any]:
    """What this process computes with: whether the pin is in effect (and why not), the pinned
    variables' values, torch's CPU capability, MKL's version and branch, the CPU model and the
    library versions. Imports torch."""
    import numpy
    import torch
    import transformers

    env = {k: os.environ.get(k) for k in PIN}
    out: dict[str, Any] = {"pin": env, "cpu_capability": torch.backends.cpu.get_cpu_capability(), **_mkl(),
                           "cpu": cpu_model(), "machine": platform.machine(),
                           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                           "versions": {"python": platform.python_version(), "torch": torch.__version__,
                                        "transformers": transformers.__version__, "numpy": numpy.__version__}}
    why: str | None
    if not enabled():
        why = f"{SWITCH}={os.environ.get(SWITCH)}"
    elif env != PIN and os.environ.get(NOT_NEEDED):
        why = f"not needed: {os.environ[NOT_NEEDED]}"
    elif env != PIN:
        why = "not set before torch loaded: " + ", ".join(f"{k}={env[k]}" for k in PIN if env[k] != PIN[k])
    else:
        bad = [f"{k} is {out.get(k)}, not {v}" for k, v in _EXPECTED.items() if out.get(k) != v]
        why = "the pinned level is not in effect (this CPU or torch build): " + "; ".join(bad) if bad else None
    out["pinned"] = why is None
    out["unpinned_because"] = why
    return out


def tensors_sha256(tensors: Mapping[str, Any]) -> str:
    """sha256 of named tensors in a canonical order: for each name in sorted order, the name,
    dtype, shape and the raw bytes (independent of any file format's header)."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}\0{str(t.dtype).removeprefix('torch.')}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes (hex), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_sha256(model_dir: str | os.PathLike[str]) -> str:
    """:func:`tensors_sha256` of every tensor in a checkpoint directory's ``*.safetensors`` files."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    tensors: dict[str, Any] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            tensors.update({k: st.get_tensor(k) for k in st.keys()})
    return tensors_sha256(tensors)
