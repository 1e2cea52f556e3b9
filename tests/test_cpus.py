"""The CPUs a process may use (mlmt_bench/machine/cpus.py): its affinity capped by its cgroup's CPU
quota, read from hand-made /proc/self and cgroup trees of both versions (v1 as on this kind of
machine and in Docker without a cgroup namespace, v2 as in current Docker and Kubernetes)."""

from __future__ import annotations

from pathlib import Path

from mlmt_bench.machine.cpus import CpuGroup, cpu_budget


def _proc(tmp_path: Path, cgroup: str, mountinfo: list[str], name: str = "proc") -> Path:
    """A /proc/self with ``cgroup`` and ``mountinfo`` (ROOT: ``tmp_path``)."""
    proc = tmp_path / name
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("".join(line.replace("ROOT", str(tmp_path)) + "\n" for line in mountinfo))
    return proc


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v2_the_smallest_quota_from_the_group_up_to_the_root_binds(tmp_path):
    fs = tmp_path / "cg2"
    _write(fs / "cpu.max", "max 100000\n")
    _write(fs / "jobs" / "cpu.max", "150000 100000\n")  # a parent's limit: 1.5 CPUs
    _write(fs / "jobs" / "one" / "cpu.max", "max 100000\n")
    _write(fs / "jobs" / "one" / "cpu.stat", "usage_usec 2500000\nuser_usec 2000000\n")
    proc = _proc(tmp_path, "0::/jobs/one\n", ["30 23 0:26 / ROOT/cg2 rw,nosuid - cgroup2 cgroup2 rw"])
    group = CpuGroup.find(proc)
    assert group.quota == 1.5
    assert group.used_seconds() == 2.5
    assert cpu_budget(group, cpus=list(range(8))) == 1  # rounded down: 2 threads would wait
    (fs / "jobs" / "cpu.max").write_text("400000 100000\n")
    assert cpu_budget(CpuGroup.find(proc), cpus=[0, 1]) == 2  # the affinity is the smaller


def test_v2_inside_a_cgroup_namespace_the_mount_is_the_group(tmp_path):
    """``docker run --cpus=2``: /proc/self/cgroup says ``0::/`` and the container's own group is
    mounted at /sys/fs/cgroup."""
    fs = tmp_path / "cg2"
    _write(fs / "cpu.max", "200000 100000\n")
    proc = _proc(tmp_path, "0::/\n", ["30 23 0:26 / ROOT/cg2 rw - cgroup2 cgroup2 rw"])
    assert CpuGroup.find(proc).quota == 2.0
    assert cpu_budget(CpuGroup.find(proc), cpus=list(range(64))) == 2


def test_v1_quota_and_cpuacct_usage_with_the_mount_root_of_a_container(tmp_path):
    """Docker on cgroup v1 without a namespace: the membership names the host's path
    (/docker/ID) and the container sees that group mounted at its cpu hierarchy's root."""
    cpu, acct = tmp_path / "cpu", tmp_path / "cpuacct"
    _write(cpu / "cpu.cfs_quota_us", "50000\n")
    _write(cpu / "cpu.cfs_period_us", "100000\n")
    _write(acct / "cpuacct.usage", "3000000000\n")
    proc = _proc(tmp_path, "9:name=systemd:/docker/abc\n4:cpuacct:/docker/abc\n3:cpu:/docker/abc\n0::/\n", [
        "31 23 0:28 / ROOT rw - tmpfs tmpfs rw",
        "32 31 0:29 /docker/abc ROOT/cpu rw - cgroup cgroup rw,cpu",
        "33 31 0:30 /docker/abc ROOT/cpuacct rw - cgroup cgroup rw,cpuacct",
        "41 31 0:38 / ROOT/unified rw - cgroup2 cgroup2 rw"])
    group = CpuGroup.find(proc)
    assert group.quota == 0.5 and group.used_seconds() == 3.0
    assert cpu_budget(group, cpus=[0, 1, 2, 3]) == 1  # at least one


def test_v1_on_the_host_a_nested_group_and_no_quota(tmp_path):
    cpu = tmp_path / "cpu"
    _write(cpu / "cpu.cfs_quota_us", "-1\n")
    _write(cpu / "cpu.cfs_period_us", "100000\n")
    _write(cpu / "q" / "cpu.cfs_quota_us", "300000\n")
    _write(cpu / "q" / "cpu.cfs_period_us", "100000\n")
    mounts = ["32 31 0:29 / ROOT/cpu rw - cgroup cgroup rw,cpu,cpuacct"]  # the joint hierarchy
    assert CpuGroup.find(_proc(tmp_path, "2:cpu,cpuacct:/\n", mounts, "a")).quota is None
    nested = CpuGroup.find(_proc(tmp_path, "2:cpu,cpuacct:/q\n", mounts, "b"))
    assert nested.quota == 3.0 and nested.used_seconds() is None  # no cpuacct.usage file here
    assert cpu_budget(nested, cpus=list(range(16))) == 3


def test_no_cgroup_filesystem_or_garbage_means_no_quota(tmp_path):
    assert CpuGroup.find(tmp_path / "absent") == CpuGroup(None)
    fs = tmp_path / "cg2"
    _write(fs / "cpu.max", "lots 100000\n")
    _write(fs / "cpu.stat", "usage_usec many\n")
    group = CpuGroup.find(_proc(tmp_path, "garbage\n0::/\n", ["not a mountinfo line",
                                                             "30 23 0:26 / ROOT/cg2 rw - cgroup2 cgroup2 rw"]))
    assert group.quota is None and group.used_seconds() is None
    assert cpu_budget(group, cpus=[0, 1, 2]) == 3


def test_this_machine_budget_is_at_most_its_affinity():
    import os

    assert 1 <= cpu_budget() <= len(os.sched_getaffinity(0))
