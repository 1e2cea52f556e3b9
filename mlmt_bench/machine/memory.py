"""Peak memory per phase of a training step, logged as ``mem/peak_mb/<phase>``.

Phases: ``rollout`` (generation), ``logprobs`` (the old and reference log-prob passes before
an update), ``update`` (forward/backward/optimiser), ``value`` (the learned value's feature
pass), ``eval`` (a held-out evaluation). A phase's peak is the most memory in use at any
moment between its start and end, in MiB (2**20 bytes):

- CUDA: ``torch.cuda.max_memory_allocated`` (bytes held by tensors on the current device,
  not the caching allocator's reserve), reset at every phase boundary
  (``mem/source: cuda_allocated``);
- CPU: the process's peak resident set size (``VmHWM``), reset at every phase boundary by
  writing 5 to ``/proc/self/clear_refs`` (Linux ≥ 4.0) (``mem/source: cpu_rss``). It counts
  everything the process holds (the Python heap, libraries, both models), so it is a
  best-effort upper bound of what the phase needed. Where the reset is refused, every phase
  reports the process's peak so far (``cpu_rss_lifetime``).

One tracker per process (memory is a per-process resource); phases may nest, and an outer
phase's peak includes its inner phases'.

On the CPU the end of every outermost phase hands the C heap's free pages back to the kernel
(:func:`release_freed_heap`). glibc keeps what a phase freed (tensors below its mmap threshold,
which rises to 32 MiB as large blocks are freed) and reuses it only for blocks that fit, so a
run whose phases allocate different shapes grew: SmolLM2's pilot held 11 GB with no tensor alive
after a run, and the next run in the same process was killed at 20.8 GB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

PHASES = ("rollout", "logprobs", "update", "value", "eval")
TRAIN_PHASES = ("rollout", "logprobs", "update", "value")  # logged with each train record
_MB = 2**20


class PhasePeaks:
    def __init__(self) -> None:
        self._open: list[str] = []
        self._peaks: dict[str, float] = {}
        self.lifetime_mb = 0.0  # the most seen by any reading: resets do not lower it
        self._source: str | None = None

    @property
    def source(self) -> str:
        """``cuda_allocated``, ``cpu_rss`` or ``cpu_rss_lifetime`` (see the module docstring)."""
        if self._source is None:  # on first use, not at import
            self._source = ("cuda_allocated" if torch.cuda.is_available()
                            else "cpu_rss" if reset_peak_rss() else "cpu_rss_lifetime")
        return self._source

    @property
    def cuda(self) -> bool:
        return self.source == "cuda_allocated"

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the block as phase ``name`` (its peak adds to the ones before it, by max)."""
        self._fold()
        self._open.append(name)
        self._peaks.setdefault(name, 0.0)
        self._reset()
        try:
            yield
        finally:
            self._fold()
            self._open.pop()
            if not self._open and not self.cuda:
                release_freed_heap()
            self._reset()

    def take(self, phases: Sequence[str] = PHASES, reduce: Callable[[float], float] = lambda v: v) -> dict[str, float]:
        """``{"mem/peak_mb/<phase>": MiB}`` for each of ``phases`` entered since the last take
        (then forgotten). ``reduce`` combines a value over processes (e.g. ``Dist.max``); it is
        called once per phase in ``phases`` on every process, entered or not, so that
        collectives line up."""
        out = {}
        for name in phases:
            value = reduce(self._peaks.pop(name, -1.0))
            if value >= 0:
                out[f"mem/peak_mb/{name}"] = round(value, 1)
        return out

    def peak_mb(self) -> float:
        """The process's peak so far (resets by phases do not lower it)."""
        self.lifetime_mb = max(self.lifetime_mb, self._read())
        if not self.cuda:
            self.lifetime_mb = max(self.lifetime_mb, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        return self.lifetime_mb

    def _fold(self) -> None:
        mb = self._read()
        self.lifetime_mb = max(self.lifetime_mb, mb)
        for name in self._open:
            self._peaks[name] = max(self._peaks.get(name, 0.0), mb)

    def _read(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / _MB
        return peak_rss_mb()

    def _reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        elif self.source == "cpu_rss":
            reset_peak_rss()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None


def release_freed_heap() -> bool:
    """Return the free pages of every malloc arena to the kernel (glibc ``malloc_trim(0)``);
    False where the C library has no such call. Live memory is untouched; the cost is a walk of
    the arenas' free lists (milliseconds)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS; False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _status_mb(field: str) -> float | None:
    """``field`` of ``/proc/self/status`` (``VmRSS``, ``VmHWM``: kB there), MiB; None where unread."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def rss_mb() -> float:
    """This process's resident set size now (``VmRSS``), MiB; NaN where /proc cannot be read."""
    now = _status_mb("VmRSS")
    return float("nan") if now is None else now


def peak_rss_mb() -> float:
    peak = _status_mb("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if peak is None else peak


TRACKER = PhasePeaks()


def phase(name: str):
    """``with memory.phase("update"): ...`` on the process's tracker."""
    return TRACKER.phase(name)
