"""The CPUs this process may use: its affinity, capped by its cgroup's CPU quota.

``os.cpu_count()`` counts the host's cores. A process pinned to some of them (``taskset``,
``docker run --cpuset-cpus``) may run on its affinity only, and one in a cgroup with a CFS
quota (``docker run --cpus=1.5``, a Kubernetes CPU limit, a Slurm job) gets ``quota / period``
CPUs of time however many cores it sees: more threads than that wait for the quota, and torch's
OpenMP threads spin while they wait. :func:`cpu_budget` is the count to size thread pools by;
:class:`CpuGroup` also reads how much of its quota the cgroup used, so a thread count can follow
what the other processes in the same container leave free.

Both cgroup versions are read: v2 (``cpu.max``, ``cpu.stat``'s ``usage_usec``) and v1
(``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, ``cpuacct.usage``), from this process's cgroup
(``/proc/self/cgroup``) up to its hierarchy's root; the smallest quota on that path binds.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

#: Where the cgroup hierarchies and this process's membership are read (injectable for tests).
PROC_SELF = Path("/proc/self")


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity where the platform has one)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return list(range(os.cpu_count() or 1))


@dataclass(frozen=True)
class CpuGroup:
    """This process's cgroup as far as CPU time goes.

    ``quota``: CPUs of time it may use (``quota_us / period_us``; None: no quota on the path);
    ``usage``: the file with its CPU time so far and that file's unit in seconds (None: unreadable)."""

    quota: float | None
    usage: tuple[Path, float] | None = None

    def used_seconds(self) -> float | None:
        """CPU seconds the cgroup's processes used so far (None when unreadable)."""
        if self.usage is None:
            return None
        path, unit = self.usage
        try:
            text = path.read_text()
        except OSError:
            return None
        if path.name == "cpu.stat":  # v2: "usage_usec N" among other lines
            values = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
            text = values.get("usage_usec", "")
        try:
            return int(text.strip()) * unit
        except ValueError:
            return None

    @classmethod
    def find(cls, proc: Path | None = None) -> CpuGroup:
        """This process's cgroup, read from ``proc`` (``/proc/self``): its membership and the
        mount points of its hierarchies. No cgroup filesystem (macOS, a bare chroot): no quota."""
        proc = proc or PROC_SELF
        try:
            membership = (proc / "cgroup").read_text().splitlines()
            mounts = (proc / "mountinfo").read_text().splitlines()
        except OSError:
            return cls(None)
        groups = {}  # controller ("" on v2) -> the process's cgroup path in that hierarchy
        for line in membership:
            parts = line.split(":", 2)
            if len(parts) == 3:
                for controller in parts[1].split(",") if parts[1] else [""]:
                    groups[controller] = parts[2]
        v2 = _mount(mounts, "cgroup2", None)
        if v2 is not None and "" in groups and not ("cpu" in groups and _mount(mounts, "cgroup", "cpu")):
            dirs = _up_to_root(v2, groups[""])
            quotas = [_v2_quota(d / "cpu.max") for d in dirs]
            return cls(_smallest(quotas), (dirs[0] / "cpu.stat", 1e-6) if dirs else None)
        cpu, acct = _mount(mounts, "cgroup", "cpu"), _mount(mounts, "cgroup", "cpuacct")
        quota = None
        if cpu is not None and "cpu" in groups:
            quota = _smallest([_v1_quota(d) for d in _up_to_root(cpu, groups["cpu"])])
        usage = None
        if acct is not None and "cpuacct" in groups:
            dirs = _up_to_root(acct, groups["cpuacct"])
            usage = (dirs[0] / "cpuacct.usage", 1e-9) if dirs else None
        return cls(quota, usage)


def cpu_budget(group: CpuGroup | None = None, cpus: list[int] | None = None) -> int:
    """Whole CPUs this process may keep busy: its affinity's size, capped by the cgroup quota
    (rounded down, at least 1). The count to size thread pools and worker pools by."""
    n = len(cpus if cpus is not None else usable_cpus())
    quota = (group or CpuGroup.find()).quota
    if quota is not None:
        n = min(n, math.floor(quota + 1e-9))
    return max(1, n)


#: /proc/cpuinfo flags of bfloat16 matrix instructions: Intel's AMX, AVX512-BF16 (Intel Cooper
#: Lake and later, AMD Zen 4 and later). oneDNN runs bfloat16 matmuls on them.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def bf16_instructions(cpuinfo: str | None = None) -> list[str]:
    """The :data:`BF16_FLAGS` this CPU has, from the ``flags`` line of ``cpuinfo`` (default:
    ``/proc/cpuinfo``; [] where it cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return []
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    return [f for f in BF16_FLAGS if f in flags]


def resolve_cpu_dtype(setting: str, bf16: list[str], pinned_run: bool) -> str:
    """What CPU matmuls run in: ``setting`` (``train.cpu_dtype``) itself unless it is ``auto``,
    which is ``bfloat16`` on a CPU with bfloat16 instructions (``bf16``: :func:`bf16_instructions`)
    for a run that needs no CPU pin (``pinned_run`` False: its models load pretrained weights),
    else ``float32`` (tiny models stay bit-identical; a CPU without those instructions emulates
    bfloat16 slowly)."""
    if setting != "auto":
        return setting
    return "bfloat16" if bf16 and not pinned_run else "float32"


#: OpenMP's wait settings (GNU, LLVM/Intel): one the user set is left alone.
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def oversubscribed(load: float, threads: int, cpus: int) -> bool:
    """Whether ``threads`` more busy threads oversubscribe ``cpus`` CPUs whose 1-minute load
    average is ``load`` (runnable threads): ``load + threads > cpus + 0.5`` (the half a thread of
    slack keeps an idle machine's background load, 0.0-0.4, from counting)."""
    return load + threads > cpus + 0.5


def passive_wait_when_busy(env: dict[str, str] | None = None, load: float | None = None,
                           cpus: int | None = None) -> str | None:
    """``OMP_WAIT_POLICY=PASSIVE`` in ``env`` (default: this process's environment; call it before
    torch loads, OpenMP reads it then) when the machine is already busy: its 1-minute load average
    (``load``, default ``os.getloadavg()``) plus the threads torch will use (``min(cpus, 8)``, as
    ``runner.configure_torch``) oversubscribe its ``cpus`` (default :func:`cpu_budget`). Returns
    why it was set, else None (an idle machine, or a wait variable the user set).

    Why: libgomp's default wait spins (~300k iterations) at every barrier. When another process
    holds a core, a spinning thread burns its time slice waiting for a partner thread that is not
    running: measured 2026-12-04 on a 2-core AMD EPYC at load 16-18 (``perf/pin_cost.py``,
    SmolLM2-135M generate, 2 threads), 0.3-0.4 tok/s with the default wait against 8.7-15.2 tok/s
    passive. The policy changes how idle threads wait, never what they compute (the same floats),
    so it is set only where it helps: an idle machine keeps the spinning wait's quick hand-offs."""
    env_ = os.environ if env is None else env
    if any(v in env_ for v in WAIT_VARIABLES):
        return None
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            return None
    cpus = cpu_budget() if cpus is None else cpus
    if not oversubscribed(load, min(cpus, 8), cpus):
        return None
    env_["OMP_WAIT_POLICY"] = "PASSIVE"
    return f"load average {load:.2f} on {cpus} CPUs"


def _mount(mounts: list[str], fstype: str, controller: str | None) -> tuple[Path, str] | None:
    """(mount point, the hierarchy's root as seen there) of the first ``fstype`` mount (with
    ``controller`` among its super options for v1), from ``/proc/self/mountinfo`` lines."""
    for line in mounts:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] != fstype:
            continue
        if controller is not None and controller not in tail[2].split(","):
            continue
        return Path(fields[4]), fields[3]
    return None


def _up_to_root(mount: tuple[Path, str], group: str) -> list[Path]:
    """The directories of ``group`` and each of its parents under ``mount``, the group's own
    first; a group outside what the mount shows (another namespace's root) is read at the mount."""
    point, root = mount
    rel = os.path.relpath(group, root)
    parts = [] if rel == "." or rel.startswith("..") else Path(rel).parts
    dirs = [point.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()]


def _v2_quota(path: Path) -> float | None:
    try:
        quota, period = path.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _smallest(quotas: list[float | None]) -> float | None:
    found = [q for q in quotas if q is not None]
    return min(found) if found else None
