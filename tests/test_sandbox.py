"""Attacks on the code sandbox. Each one must give reward 0 (or an honest partial reward), the
right verdict kind, return within the time limit plus a small margin, leave no process, file or
directory behind, and leave the host unharmed."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from mlmt_bench.errors import UserError
from mlmt_bench.verifiers import sandbox
from mlmt_bench.verifiers.code import verdict_from_run
from mlmt_bench.verifiers.sandbox.judge import Opaque, decode_value, encode_value

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")

MARGIN_S = 3.0
CAPS = sandbox.capabilities()
needs_root_isolation = pytest.mark.skipif(not CAPS["uid_drop"], reason="needs root (uid drop)")


def _sandbox_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("mlmt-sbx-*")}


def _procs_of(run: sandbox.RunResult) -> list[psutil.Process]:
    """Processes that belong to the run: its private uid, or its environment marker."""
    marker = f"MLMT_SANDBOX={run.token}".encode()
    found = []
    for p in psutil.process_iter(["uids"]):
        try:
            uids = p.info["uids"]
            if run.uid is not None and uids is not None and run.uid in (uids.real, uids.effective, uids.saved):
                found.append(p)
                continue
            with open(f"/proc/{p.pid}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    found.append(p)
        except (OSError, psutil.Error):
            continue
    return found


def _files_of(uid: int | None) -> list[str]:
    if uid is None:
        return []
    out = []
    for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
        try:
            for e in os.scandir(d):
                try:
                    if e.stat(follow_symlinks=False).st_uid == uid:
                        out.append(e.path)
                except OSError:
                    pass
        except OSError:
            pass
    return out


def attack(program: str, tests=("assert f(1) == 2", "assert f(2) == 3"), *, timeout_s: float = 5.0,
           markers: tuple[str, ...] = (), setup: str = "", caps=None, **limits):
    """Run a hostile program; check time, leftovers and host health; return (verdict, run)."""
    program = textwrap.dedent(program)
    dirs_before = _sandbox_dirs()
    host_children_before = {c.pid for c in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    run = sandbox.run_tests(program, list(tests), setup, sandbox.Limits(timeout_s=timeout_s, **limits), caps=caps)
    elapsed = time.monotonic() - t0
    verdict = verdict_from_run(run, program)
    assert elapsed < timeout_s + MARGIN_S, f"took {elapsed:.1f}s"
    assert run.status != "sandbox_error", run.error
    assert 0.0 <= verdict.reward <= 1.0
    leftovers = _procs_of(run)
    assert not leftovers, f"processes left behind: {[(p.pid, p.name()) for p in leftovers]}"
    new_children = {c.pid for c in psutil.Process().children(recursive=True)} - host_children_before
    assert not new_children, f"host has new child processes {new_children}"
    for m in markers:
        assert not os.path.lexists(m), f"{m} was left behind"
    assert _sandbox_dirs() <= dirs_before, "a sandbox working directory was left behind"
    assert not _files_of(run.uid), f"files of the sandbox uid left: {_files_of(run.uid)}"
    assert psutil.Process().is_running()
    return verdict, run


# ------------------------------------------------------------------------------ attacks


def test_infinite_loop():
    v, run = attack("while True:\n    pass\n", timeout_s=1.5)
    assert (v.kind, v.reward) == ("timeout", 0.0)


def test_infinite_loop_in_one_test_keeps_honest_partial_credit():
    v, _ = attack("""
        def f(x):
            while x == 2:
                pass
            return x + 1
        """, tests=("assert f(1) == 2", "assert f(2) == 3"), timeout_s=1.5)
    assert v.kind == "timeout" and v.reward == 0.5


def test_fork_bomb_is_contained():
    peak: dict[int, int] = {}
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            counts: dict[int, int] = {}
            for p in psutil.process_iter(["uids"]):
                u = p.info["uids"]
                if u is not None and u.real >= 1_000_000_000:
                    counts[u.real] = counts.get(u.real, 0) + 1
            for u, n in counts.items():
                peak[u] = max(peak.get(u, 0), n)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        v, run = attack("""
            import os
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
            """, timeout_s=2.0, nproc=16)
    finally:
        stop.set()
        watcher.join()
    assert v.reward == 0.0 and v.kind == "timeout"
    if run.uid is not None:
        assert peak.get(run.uid, 0) <= 16, peak


def test_ten_gigabyte_allocation():
    v, _ = attack("x = bytearray(10 * 1024 ** 3)\ndef f(x):\n    return x + 1\n")
    assert (v.kind, v.reward) == ("sandbox_violation", 0.0)
    assert "memory" in v.detail


def test_ten_gigabyte_allocation_inside_the_tested_function():
    v, _ = attack("def f(x):\n    return len(bytearray(10 * 1024 ** 3)) + x\n")
    assert (v.kind, v.reward) == ("sandbox_violation", 0.0)


def test_many_processes_each_below_the_memory_limit_hit_the_run_total():
    """12 processes x 300 MB, each under RLIMIT_AS: the run's memory cgroup stops them (without
    it, RLIMIT_AS x RLIMIT_NPROC bounds the damage)."""
    v, run = attack("""
        import os, time
        for _ in range(12):
            if os.fork() == 0:
                break
        block = bytearray(300 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(10)
        def f(x):
            return x + 1
        """, timeout_s=4.0, memory_mb=512, total_memory_mb=768)
    assert v.reward == 0.0
    if CAPS["cgroup"]:
        assert v.kind == "sandbox_violation" and "memory" in v.detail
    else:
        assert v.kind in ("timeout", "sandbox_violation", "crash")


def test_one_gigabyte_print_hits_the_output_cap():
    v, run = attack("""
        import sys
        chunk = "x" * (1 << 20)
        for _ in range(1024):
            sys.stdout.write(chunk)
        def f(x):
            return x + 1
        """)
    assert (v.kind, v.reward) == ("sandbox_violation", 0.0)
    assert "output" in v.detail
    assert len(run.stdout) <= 4096  # only a tail is kept


def test_big_file_write_hits_the_file_size_limit():
    v, _ = attack("""
        with open("big.bin", "wb") as fh:
            for _ in range(64):
                fh.write(b"x" * (1 << 20))
        def f(x):
            return x + 1
        """, fsize_mb=4)
    assert v.reward == 0.0 and v.kind == "sandbox_violation"


def test_deep_recursion():
    v, _ = attack("""
        import sys
        sys.setrecursionlimit(10 ** 8)
        def f(n):
            return f(n + 1) + 1
        """, timeout_s=3.0, memory_mb=256)
    assert v.reward == 0.0 and v.kind in ("wrong", "crash", "timeout", "sandbox_violation")


def test_plain_recursion_error_is_a_wrong_answer():
    v, _ = attack("def f(n):\n    return f(n + 1)\n")
    assert (v.kind, v.reward) == ("wrong", 0.0) and "RecursionError" in v.detail


def test_killing_the_parent_and_everything_else_harms_no_host_process():
    sentinel = subprocess.Popen(["sleep", "60"])
    try:
        v, run = attack(f"""
            import os, signal
            for pid in [os.getppid(), -1, 0, 1, {os.getpid()}, {sentinel.pid}, {os.getppid()}]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except Exception:
                    pass
            for name in os.listdir("/proc"):
                if name.isdigit() and int(name) != os.getpid():
                    try:
                        os.kill(int(name), signal.SIGKILL)
                    except Exception:
                        pass
            def f(x):
                return x
            """)
        assert sentinel.poll() is None, "the sandbox killed a host process"
        assert v.reward == 0.0 and v.kind in ("wrong", "crash")
    finally:
        sentinel.kill()
        sentinel.wait()


def test_writing_outside_the_working_directory_fails_or_is_undone():
    tag = secrets.token_hex(6)
    targets = [f"/tmp/mlmt_escape_{tag}", f"/var/tmp/mlmt_escape_{tag}", f"/dev/shm/mlmt_escape_{tag}",
               f"/tmp/mlmt_escape_dir_{tag}", f"{Path.cwd()}/mlmt_escape_{tag}",
               f"{Path(__file__).parent}/mlmt_escape_{tag}", f"/root/mlmt_escape_{tag}",
               f"/mlmt_escape_{tag}", f"/run/lock/mlmt_escape_{tag}"]
    v, run = attack(f"""
        import os
        for path in {targets!r}:
            try:
                if "dir" in os.path.basename(path):
                    os.makedirs(path + "/sub")
                    open(path + "/sub/f", "w").write("x")
                else:
                    with open(path, "w") as fh:
                        fh.write("escaped")
            except Exception:
                pass
        open("inside.txt", "w").write("fine")  # its own directory is writable
        def f(x):
            return x
        """, markers=tuple(targets))
    assert v.reward == 0.0 and v.kind == "wrong"


@pytest.fixture
def listening_server():
    """A non-blocking TCP server on a free localhost port: ``(socket, port)``. If the sandboxed
    program reached it, ``accept()`` would return instead of raising BlockingIOError."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.setblocking(False)
    yield server, server.getsockname()[1]
    server.close()


def test_opening_a_socket_connect_and_bind(listening_server):
    server, port = listening_server
    v, _ = attack(f"""
        import socket
        ok = []
        try:
            s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
            s.sendall(b"escaped")
            ok.append("connect")
        except Exception:
            pass
        try:
            b = socket.socket()
            b.bind(("127.0.0.1", 0))
            b.listen(1)
            ok.append("bind")
        except Exception:
            pass
        def f(x):
            return x + 1
        """)
    assert (v.kind, v.reward) == ("sandbox_violation", 0.0)
    assert "network" in v.detail
    with pytest.raises(BlockingIOError):
        server.accept()


@pytest.mark.skipif(not CAPS["netns"], reason="needs a network namespace")
def test_socket_from_a_fresh_interpreter_without_the_audit_hook_still_has_no_network(listening_server):
    server, port = listening_server
    v, run = attack(f"""
        import subprocess, sys
        r = subprocess.run([sys.executable, "-I", "-c",
            "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1); print('CONNECTED')"],
            capture_output=True, text=True)
        print(r.stdout, r.stderr[-200:])
        def f(x):
            return x
        """)
    assert "CONNECTED" not in run.stdout
    assert v.reward == 0.0
    with pytest.raises(BlockingIOError):
        server.accept()


def test_sys_exit_before_the_tests():
    v, _ = attack("import sys\ndef f(x):\n    return x + 1\nsys.exit(0)\n")
    assert (v.kind, v.reward) == ("crash", 0.0)


def test_os_exit_before_the_tests():
    v, _ = attack("import os\ndef f(x):\n    return x + 1\nos._exit(0)\n")
    assert (v.kind, v.reward) == ("crash", 0.0)


def test_os_exit_inside_the_tested_function():
    v, _ = attack("import os\ndef f(x):\n    os._exit(0)\n")
    assert (v.kind, v.reward) == ("crash", 0.0)


def test_monkeypatching_assert_builtins_and_eq_cannot_fake_a_pass():
    v, run = attack("""
        import builtins, math, sys, gc

        class Liar(int):
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            __hash__ = int.__hash__

        class Anything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __bool__(self): return True
            def __len__(self): return 1
            def __iter__(self): return iter([2])
            def __float__(self): return 2.0
            def __lt__(self, other): return True
            __gt__ = __le__ = __ge__ = __lt__
            __hash__ = object.__hash__

        class NoAssert(Exception):
            pass

        builtins.AssertionError = NoAssert
        builtins.print = lambda *a, **k: None
        builtins.isinstance = lambda *a: True
        builtins.set = lambda *a: {2}
        builtins.sorted = lambda *a, **k: [2]
        math.isclose = lambda *a, **k: True
        sys.modules["math"] = math
        __builtins__ = {"True": True}

        def f(x):
            if x == 1:
                return Liar(7)
            if x == 2:
                return Anything()
            return [Anything()]
        """, tests=("assert f(1) == 2", "assert f(2) == 3", "assert math.isclose(f(2), 2.5)",
                    "assert set(f(3)) == {5}", "assert sorted(f(3)) == [6]", "assert f(2) == f(1)",
                    "assert not (f(1) != 2)", "assert isinstance(f(2), int) and f(2) == 9"))
    assert (v.kind, v.reward) == ("wrong", 0.0), (v, run.details)


def test_rebinding_an_expected_value_defined_by_the_setup_does_not_help():
    v, _ = attack("""
        def f(x):
            globals()["expected"] = 7
            globals()["expected_list"] = [7]
            return 7
        """, tests=("assert f(1) == expected", "assert [f(1)] == expected_list"),
        setup="expected = 12345\nexpected_list = [12345]")
    assert (v.kind, v.reward) == ("wrong", 0.0)


def test_inspecting_frames_and_memory_finds_no_expected_value():
    secret = 10 ** 17 + secrets.randbelow(10 ** 17)
    v, run = attack(f"""
        import gc, sys, re
        def _hunt():
            found = set()
            f = sys._getframe(1)
            while f is not None:
                for d in (f.f_locals, f.f_globals):
                    for val in list(d.values()):
                        found.update(re.findall(r"\\d{{18}}", repr(val)[:100000]))
                found.update(re.findall(r"\\d{{18}}", repr(f.f_code.co_consts)))
                f = f.f_back
            for o in gc.get_objects():
                if isinstance(o, (str, bytes, int)):
                    found.update(re.findall(r"\\d{{18}}", str(o)[:10000]))
            return [int(x) for x in found if x != "{10 ** 17}"]
        def f(x):
            got = _hunt()
            return got[0] if got else 0
        """, tests=(f"assert f(0) == {secret}",))
    assert (v.kind, v.reward) == ("wrong", 0.0)


def test_reading_the_tests_file_finds_nothing():
    secret = 10 ** 17 + secrets.randbelow(10 ** 17)
    data_file = str(Path(__file__).resolve().parents[1] / "data" / "mbpp.jsonl")
    v, run = attack(f"""
        import os, re
        hits = []
        def scan(path):
            try:
                with open(path, "rb") as fh:
                    data = fh.read(1 << 20)
            except Exception:
                return
            hits.extend(int(x) for x in re.findall(rb"\\d{{18}}", data))
        for root in [os.getcwd(), "/tmp", "/var/tmp", "/dev/shm", "/sandbox"]:
            for dirpath, _dirs, files in os.walk(root):
                for name in files:
                    scan(os.path.join(dirpath, name))
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                for what in ("cmdline", "environ", "fd/0", "fd/3"):
                    scan(f"/proc/{{pid}}/{{what}}")
        for fd in range(64):
            try:
                os.set_blocking(fd, False)
                hits.extend(int(x) for x in re.findall(rb"\\d{{18}}", os.read(fd, 1 << 16)))
            except Exception:
                pass
        print("DATA_READABLE" if os.access({data_file!r}, os.R_OK) else "DATA_HIDDEN", flush=True)
        def f(x):
            return hits[0] if hits else 0
        """, tests=(f"assert f(0) == {secret}",))
    assert v.reward == 0.0 and v.kind in ("wrong", "crash")
    assert str(secret) not in run.stdout
    if CAPS["jail"] and os.path.exists(data_file):
        assert "DATA_HIDDEN" in run.stdout


def test_background_processes_are_killed():
    """Executed programs in a new session and ignoring SIGHUP (what nohup does; the jail has the
    interpreter but no /usr/bin, so the interpreter is the program) and a double-fork daemon."""
    tag = secrets.token_hex(6)
    late = f"/tmp/mlmt_late_{tag}"
    v, run = attack(f"""
        import os, subprocess, sys, time
        sleeper = "import signal, time; signal.signal(signal.SIGHUP, signal.SIG_IGN); time.sleep(60)"
        subprocess.Popen([sys.executable, "-c", sleeper], start_new_session=True)
        subprocess.Popen([sys.executable, "-c", sleeper], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print("SPAWNED", flush=True)
        if os.fork() == 0:          # classic daemon: double fork + setsid
            os.setsid()
            if os.fork() == 0:
                signal_safe = True
                time.sleep(1.0)
                with open({late!r}, "w") as fh:
                    fh.write("still alive")
                time.sleep(60)
            os._exit(0)
        def f(x):
            return x
        """, markers=(late,))
    assert (v.kind, v.reward) == ("wrong", 0.0) and "SPAWNED" in run.stdout
    time.sleep(1.5)  # the daemon would have written its file by now
    assert not os.path.exists(late)
    assert not _procs_of(run)


@pytest.mark.skipif(not CAPS["jail"], reason="needs the jail (root, mount namespaces)")
def test_what_the_jail_shows():
    """A candidate walks / and reports every path it can see (the standard library's own files
    only counted). It sees the interpreter, its libraries and its standard library, and nothing
    else of the host: of /etc only the loader's cache, no site-packages, no project, no /work,
    no home directories, no /usr/bin or shell."""
    import base64
    import json
    import zlib

    v, run = attack("""
        import base64, json, os, zlib
        stdlib = os.path.dirname(os.__file__)
        seen, n_stdlib = [], 0
        for root, dirs, files in os.walk("/"):
            if root == "/proc":  # the kernel's view of this PID namespace
                dirs[:] = []
                continue
            for name in dirs + files:
                path = os.path.join(root, name)
                if path.startswith(stdlib + "/") and "-packages" not in path:
                    n_stdlib += 1
                else:
                    seen.append(path + (" -> " + os.readlink(path) if os.path.islink(path) else ""))
        blob = zlib.compress(json.dumps({"seen": seen, "n_stdlib": n_stdlib}).encode(), 9)
        print("LISTING", base64.b64encode(blob).decode(), flush=True)
        def f(x):
            return x
        """, tests=("assert f(1) == 1",))
    assert (v.kind, v.reward) == ("ok", 1.0), v.detail
    listing = json.loads(zlib.decompress(base64.b64decode(run.stdout.split("LISTING ")[1].split()[0])))
    shown = [p.split(" -> ")[0] for p in listing["seen"]]
    files = {p for p in shown if not any(q.startswith(p + "/") for q in shown) and p.split("/")[1] not in ("dev",)}
    # what the interpreter needs is there
    assert os.path.realpath(sys.executable) in files and any(p.endswith("/libc.so.6") for p in files)
    assert listing["n_stdlib"] > 500 and "/sandbox/solution.py" in files
    # and nothing else of the host
    assert [p for p in shown if p.startswith("/etc/")] == ["/etc/ld.so.cache"]
    assert not [p for p in shown if "site-packages/" in p or "dist-packages/" in p]
    for hidden in ("/work", str(Path(__file__).resolve().parents[1]), "/home", "/usr/bin", "/usr/local/bin",
                   "/usr/share", "/usr/include", "/bin/sh", "/opt", "/var/lib", "/srv", "/mnt", sys.prefix,
                   os.path.expanduser("~/.ssh"), os.path.expanduser("~/.cache")):
        assert not [p for p in shown if p == hidden or p.startswith(hidden + "/")], hidden
    prefix = os.path.realpath(sys.base_prefix)
    assert all(prefix.startswith(p) or p.startswith(prefix + "/") for p in shown if p.startswith("/root"))
    # every file shown (and empty directory) is bound by the jail's plan, is a symlink it recreates, or its own
    plan = CAPS["jail_plan"]
    own = {"/sandbox/solution.py", "/tmp", "/var/tmp", "/proc"}  # its own (empty) directories
    links = {link for link, _ in plan["links"]}
    stray = [p for p in files - own - links if not any(p == b or p.startswith(b + "/") for b in plan["binds"])]
    assert not stray, stray


# ------------------------------------------------------------------------------ fallback mode


@needs_root_isolation
@pytest.mark.parametrize("program,kind", [
    ("import os, subprocess\nsubprocess.Popen(['sleep', '60'], start_new_session=True)\n"
     "if os.fork() == 0:\n    os.setsid()\n    import time; time.sleep(60)\ndef f(x):\n    return x\n", "wrong"),
    ("import socket\nsocket.socket().connect(('127.0.0.1', 9))\n", "sandbox_violation"),
    ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", "timeout"),
])
def test_uid_drop_alone_still_contains_the_attack(program, kind):
    """Without namespaces or jail (only the private uid): the uid reaper and file sweep act."""
    caps = sandbox.capabilities(disable=("pidns", "netns", "jail"))
    tag = secrets.token_hex(6)
    marker = f"/tmp/mlmt_fallback_{tag}"
    program = f"try:\n    open({marker!r}, 'w').write('x')\nexcept Exception:\n    pass\n" + program
    v, run = attack(program, timeout_s=1.5, markers=(marker,), caps=caps)
    assert (v.kind, v.reward) == (kind, 0.0)
    assert "uid_drop" in run.mechanisms and "netns" not in run.mechanisms


def test_basic_mode_without_uid_or_namespaces_still_kills_background_processes():
    """The weakest mode (what a non-root host gets): process-tree tracking by the judge (a child
    subreaper) and the environment-marker scan still remove every process; the host temp
    working directory is removed. (The candidate runs as the host user here, so only benign
    attacks are tried.)"""
    caps = sandbox.capabilities(disable=("uid_drop", "pidns", "netns", "jail"))
    v, run = attack("""
        import os, subprocess, time
        subprocess.Popen(["sleep", "60"], start_new_session=True)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        open("inside.txt", "w").write("x")
        def f(x):
            return x
        """, caps=caps)
    assert (v.kind, v.reward) == ("wrong", 0.0)
    assert run.uid is None and "uid_drop" not in run.mechanisms


def test_capabilities_can_be_turned_off_explicitly():
    caps = sandbox.capabilities(disable=("jail", "netns"))
    assert not caps["jail"] and not caps["netns"] and caps["disabled"] == ["jail", "netns"]
    assert caps["uid_drop"] == CAPS["uid_drop"] and caps["pidns"] == CAPS["pidns"]
    assert sandbox.capabilities()["jail"] == CAPS["jail"]  # the explicit choice is not remembered
    with pytest.raises(UserError, match="unknown mechanism"):
        sandbox.capabilities(disable=("jial",))


def test_the_environment_alone_cannot_weaken_the_sandbox(monkeypatch, tmp_path):
    """MLMT_SANDBOX_DISABLE once switched mechanisms off without a word; now every way in refuses:
    the sandbox API, the code verifier, and `mlmt-bench verify code` (exit 2, one line)."""
    monkeypatch.setenv(sandbox.DISABLE_ENV, "jail,netns,uid_drop")
    with pytest.raises(UserError, match="MLMT_SANDBOX_DISABLE is set"):
        sandbox.capabilities()
    with pytest.raises(UserError, match="MLMT_SANDBOX_DISABLE is set"):
        sandbox.run_tests("def f(x):\n    return x\n", ["assert f(1) == 1"])
    from mlmt_bench.verifiers.code import CodeVerifier

    with pytest.raises(UserError, match="MLMT_SANDBOX_DISABLE is set"):
        CodeVerifier()
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"problem": {"id": "p", "prompt": "", "answer": "", "tests": ["assert f(1) == 1"]}, '
                   '"response": "def f(x):\\n    return x"}\n')
    proc = subprocess.run([sys.executable, "-m", "mlmt_bench.cli", "verify", "code", str(inp), "--out",
                           str(tmp_path / "out.jsonl")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: MLMT_SANDBOX_DISABLE is set") and not (tmp_path / "out.jsonl").exists()


# ------------------------------------------------------------------------------ plumbing


def test_mechanisms_reported():
    run = sandbox.run_tests("def f(x):\n    return x\n", ["assert f(1) == 1"])
    assert run.passed == [True]
    assert "rlimits" in run.mechanisms and "audit_hook_no_sockets" in run.mechanisms
    for m, name in (("uid_drop", "uid_drop"), ("pidns", "pidns"), ("netns", "netns"), ("jail", "mntns_chroot_jail"),
                    ("cgroup", "cgroup_memory")):
        assert (name in run.mechanisms) == CAPS[m]


def test_value_encoding_round_trip():
    import collections
    import decimal
    import fractions

    values = [None, True, 3, -(1 << 80), 2.5, float("inf"), 1 + 2j, "s\udcff", b"\x00", bytearray(b"ab"),
              [1, (2, 3)], {"a": {1, 2}}, frozenset({1}), range(1, 9, 2), collections.Counter("aab"),
              collections.OrderedDict(a=1), collections.deque([1, 2], 5), decimal.Decimal("1.10"),
              fractions.Fraction(1, 3)]
    for v in values:
        assert decode_value(encode_value(v)) == v
    assert list(decode_value(encode_value(iter([1, 2])))) == [1, 2]
    opaque = decode_value(encode_value(object()))
    assert isinstance(opaque, Opaque) and bool(opaque) and opaque != opaque.__class__("object", True)


@pytest.mark.parametrize("bad", [["L", ["I", "zz"]], ["D", 1], ["X"], {"a": 1}, ["S", ["L"]], ["OBJ", "x", 3]])
def test_decoding_rejects_malformed_values(bad):
    with pytest.raises((ValueError, TypeError)):
        decode_value(bad)


def test_parallel_runs_do_not_interfere():
    from concurrent.futures import ThreadPoolExecutor

    progs = [(f"def f(x):\n    return x + {i}\n", [f"assert f(1) == {i + 1}", f"assert f(2) == {i + 2 + i % 2}"])
             for i in range(8)]
    with ThreadPoolExecutor(4) as ex:
        runs = list(ex.map(lambda a: sandbox.run_tests(*a, limits=sandbox.Limits(timeout_s=5)), progs))
    assert [r.passed for r in runs] == [[True, i % 2 == 0] for i in range(8)]
    uids = [r.uid for r in runs]
    if CAPS["uid_drop"]:
        assert len(set(uids)) == len(uids)
