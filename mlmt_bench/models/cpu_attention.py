"""Attention in bfloat16 / float16 on a CPU whose kernels the CPU pin caps below what it has.

Under the pin (``ATEN_CPU_CAPABILITY=avx2``, :mod:`mlmt_bench.machine.reproducible`) on a CPU with AMX
(measured 2026-12-03 on an Intel Xeon, Sapphire Rapids), torch 2.13's CPU flash attention in
bfloat16 picks a packing routine that needs AVX-512 dispatch and raises ``RuntimeError:
pack_vnni2 is only supported when avx512 is supported`` for sequences of 64 tokens and more
(16 pass); float32 is unaffected. :func:`install` wraps transformers' ``sdpa`` attention so that
a reduced-precision CPU call that raises this runs on torch's math backend instead, and every
later one of that dtype goes there directly. Nothing changes where the flash kernel works, so no
weights change on any machine that ran before.
"""

from __future__ import annotations

from typing import Any

#: dtypes whose CPU flash attention raised here (they use the math backend from then on)
_FAILED: set[Any] = set()
_MARK = "_mlmt_bench_cpu_guard"


def _flash_cannot_run(exc: RuntimeError) -> bool:
    return "only supported when avx512 is supported" in str(exc)


def install() -> None:
    """Wrap transformers' ``sdpa`` attention function once (idempotent)."""
    import torch
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    if getattr(original, _MARK, False):
        return

    def math_backend(module: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return original(module, query, *args, **kwargs)

    def sdpa(module: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if query.device.type != "cpu" or query.dtype not in (torch.bfloat16, torch.float16):
            return original(module, query, *args, **kwargs)
        if query.dtype in _FAILED:
            return math_backend(module, query, *args, **kwargs)
        try:
            return original(module, query, *args, **kwargs)
        except RuntimeError as exc:
            if not _flash_cannot_run(exc):
                raise
            _FAILED.add(query.dtype)
            return math_backend(module, query, *args, **kwargs)

    setattr(sdpa, _MARK, True)
    ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa
