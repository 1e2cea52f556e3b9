"""Untrusted data stays data (ARCHITECTURE.md; issue 19, "Security"): run directories,
checkpoints, specs and ``verify`` inputs may come from someone else. Nothing loaded from them
runs code, nothing is written where it does not belong, and no error message shows the content
of a file. Each case plants what an attacker would and checks the host afterwards."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from conftest import minimal_spec
from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.io.checkpoint_state import STATE_FILE, load_state, save_state
from mlmt_bench.tracking import JsonlWriter, RunDir, atomic_write_bytes, check_output_root
from support import one_line_error

REPO = Path(__file__).resolve().parents[1]
SECRET = "root:$6$Zq8SECRETHASHx1$aB3dEfGh:19000:0:99999:7:::"


def _cli_process(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlmt_bench.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def _fake_run_dir(root: Path, ckpt: Path, name: str = "run") -> Path:
    """A run directory as `run` leaves it when killed: spec, manifest (running), one checkpoint."""
    run = root / name
    (run / "checkpoints" / "step-000001").mkdir(parents=True)
    spec = minimal_spec(output_dir=str(root), name="t")
    spec["policies"]["solver"]["path"] = str(ckpt)
    spec["benchmark"] = {"name": "synthetic-arith", "eval_limit": 2}
    (run / "spec.resolved.yaml").write_text(yaml.safe_dump(spec))
    (run / "manifest.json").write_text(json.dumps({"name": "t", "status": "running", "seed": 0}))
    return run


class _Payload:
    """Unpickling it runs a command (what a crafted trainer_state.pt does)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# ---------------------------------------------------------------------------------------------
# 1. checkpoints load without running code


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_resume_does_not_run_a_pickle_planted_as_the_trainer_state(tiny_ckpt, tmp_path, protocol):
    marker = tmp_path / "PWNED"
    run = _fake_run_dir(tmp_path, tiny_ckpt)
    with open(run / "checkpoints" / "step-000001" / "trainer_state.pt", "wb") as f:
        pickle.dump({"counters": _Payload(marker)}, f, protocol=protocol)
    proc = _cli_process(["-q", "run", "--resume", str(run)])
    assert not marker.exists(), "the pickle ran"
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-1500:]
    assert proc.stderr.startswith("error: ") and "trainer_state.pt: refused, not loaded" in proc.stderr
    assert "posix.system" in proc.stderr or "Unsupported" in proc.stderr, proc.stderr


def test_a_pickle_named_as_the_new_state_file_is_just_a_corrupt_file(tmp_path):
    marker = tmp_path / "PWNED"
    (tmp_path / STATE_FILE).write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(UserError, match="unreadable checkpoint state"):
        load_state(tmp_path)
    assert not marker.exists()


def test_trainer_state_round_trips_exactly(tmp_path):
    """Every kind of value the trainer saves comes back identical: tensor dtypes and shapes,
    tuples, integer keys (an optimiser's state), numpy's RNG array, NaN/inf floats, and the RNG
    streams continue where they stopped."""
    torch.manual_seed(3)
    random.seed(4)
    np.random.seed(5)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.randn(3, 2))], lr=1e-3)
    opt.param_groups[0]["params"][0].grad = torch.ones(3, 2)
    opt.step()
    gen = torch.Generator().manual_seed(7)
    state = {"counters": {"step": 3, "flops": 1.5e12, "wall_s": float("inf"), "x": float("nan")},
             "optimizers": {"solver": (opt.state_dict(), {"base_lrs": [0.1], "lr_lambdas": [None]})},
             "algorithm": {"value_model": {"gen": gen.get_state(), "feats": torch.randn(4, 3, dtype=torch.bfloat16),
                                           "targets": torch.zeros(0), "sizes": [2, 2]}},
             "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
             "__tuple__": "a key that looks like a tag"}
    save_state(tmp_path, state)
    expect = (torch.rand(3), random.random(), np.random.rand())
    back = load_state(tmp_path)
    torch.set_rng_state(back["rng"]["torch"])
    random.setstate(back["rng"]["python"])
    np.random.set_state(back["rng"]["numpy"])
    assert (torch.equal(torch.rand(3), expect[0]), random.random(), np.random.rand()) == (True, *expect[1:])
    o = back["optimizers"]["solver"][0]
    assert isinstance(back["optimizers"]["solver"], tuple) and list(o["state"]) == [0]
    assert o["param_groups"][0]["betas"] == (0.9, 0.999) and isinstance(o["param_groups"][0]["betas"], tuple)
    ref = opt.state_dict()["state"][0]
    assert all(torch.equal(o["state"][0][k], ref[k]) and o["state"][0][k].dtype == ref[k].dtype for k in ref)
    v = back["algorithm"]["value_model"]
    assert v["feats"].dtype == torch.bfloat16 and torch.equal(v["feats"], state["algorithm"]["value_model"]["feats"])
    assert torch.equal(v["gen"], gen.get_state()) and v["targets"].shape == (0,) and v["sizes"] == [2, 2]
    c = back["counters"]
    assert c["step"] == 3 and c["wall_s"] == float("inf") and c["x"] != c["x"]
    assert back["__tuple__"] == "a key that looks like a tag"


def test_a_legacy_trainer_state_of_plain_data_still_loads(tmp_path):
    state = {"counters": {"step": 2}, "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                                              "python": random.getstate()}}
    torch.save(state, tmp_path / "trainer_state.pt")
    back = load_state(tmp_path)
    assert back["counters"] == {"step": 2} and np.array_equal(back["rng"]["numpy"][1], state["rng"]["numpy"][1])


# ---------------------------------------------------------------------------------------------
# 2. tests that come with a verify input line run in the sandbox, not as root on the host


def test_verify_code_tests_from_the_input_cannot_write_on_the_host(tmp_path):
    from mlmt_bench.verifiers.sandbox import capabilities

    marker = tmp_path / "WRITTEN_BY_A_TEST"
    probe = tmp_path / "probe.txt"
    probe.write_text("host file\n")
    tests = [f"open({str(marker)!r}, 'w').write('the judge ran me')",
             f"import os; assert not os.path.exists({str(probe)!r})",  # the host's files are not there
             "assert f(2) == 2"]
    if capabilities()["uid_drop"]:
        tests.append("import os; assert os.getuid() != 0 and os.geteuid() != 0")  # not root either
    line = {"problem": {"id": "p", "prompt": "", "tests": tests}, "response": "```python\ndef f(x):\n    return x\n```"}
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps(line) + "\n")
    res = CliRunner().invoke(app, ["verify", "code", str(inp), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert not marker.exists(), "a test from the input wrote on the host"
    verdict = json.loads(out.read_text())["verdict"]
    assert verdict["kind"] == "wrong" and "test 1:" in verdict["detail"], verdict
    caps = capabilities()
    assert verdict["reward"] == (len(tests) - 1) / len(tests) if caps["jail"] else verdict["reward"] > 0


# ---------------------------------------------------------------------------------------------
# 3. outputs go only to regular files or new paths


def test_verify_out_onto_a_fifo_proc_or_a_directory_is_refused(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"problem": {"id": "x", "prompt": "1+1", "answer": "2"},
                               "response": "\\boxed{2}"}) + "\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one_line_error(["verify", "math", str(inp), "--out", str(fifo)], "is a FIFO, refused")
    assert fifo.is_fifo()  # still the FIFO: not replaced by a regular file
    one_line_error(["verify", "math", str(inp), "--out", "/proc/self/mlmt-out.jsonl"], "under /proc, refused")
    one_line_error(["verify", "math", str(inp), "--out", "/proc/self/fd/1"], "under /proc, refused")
    one_line_error(["verify", "math", str(inp), "--out", str(tmp_path)], "is a directory, refused")
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "elsewhere.jsonl")
    one_line_error(["verify", "math", str(inp), "--out", str(link)], "is a symbolic link, refused")
    assert not (tmp_path / "elsewhere.jsonl").exists()
    res = CliRunner().invoke(app, ["verify", "math", str(inp), "--out", str(tmp_path / "new.jsonl")])
    assert res.exit_code == 0 and (tmp_path / "new.jsonl").is_file()


def test_report_out_onto_a_file_or_under_proc_is_one_line(tmp_path):
    a_file = tmp_path / "a.txt"
    a_file.write_text("x")
    one_line_error(["report", str(tmp_path), "--out", str(a_file)], "is a regular file, not a directory")
    one_line_error(["report", str(tmp_path), "--out", str(a_file / "sub")], "is a regular file, not a directory")
    one_line_error(["report", str(tmp_path), "--out", "/proc/self/mlmt-report"], "under /proc, refused")
    one_line_error(["report", str(tmp_path), "--out", "/sys/kernel/mlmt-report"], "under /sys, refused")
    assert a_file.read_text() == "x"


def test_atomic_writes_never_replace_or_follow_what_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "comparison.md"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="is a FIFO, refused"):
        atomic_write_bytes(fifo, b"report")
    assert fifo.is_fifo()
    target = tmp_path / "target"
    (tmp_path / "metrics.jsonl").symlink_to(target)
    with pytest.raises(UserError, match="symlink is refused"):
        JsonlWriter(tmp_path / "metrics.jsonl")
    assert not target.exists()
    atomic_write_bytes(tmp_path / "ok.md", b"1")
    atomic_write_bytes(tmp_path / "ok.md", b"2")
    assert (tmp_path / "ok.md").read_bytes() == b"2" and sorted(p.name for p in tmp_path.iterdir()) == [
        "comparison.md", "metrics.jsonl", "ok.md"]  # no temporary file left


# ---------------------------------------------------------------------------------------------
# 4. no symlinked run-directory parts, no system directory as an output root


@pytest.mark.parametrize("part", ["checkpoints", "step", "run", "metrics", "weights"])
def test_resume_refuses_a_run_directory_with_symlinked_parts(tiny_ckpt, tmp_path, part):
    run = _fake_run_dir(tmp_path / "runs", tiny_ckpt)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = run
    if part == "checkpoints":
        (run / "checkpoints").rename(elsewhere / "checkpoints")
        (run / "checkpoints").symlink_to(elsewhere / "checkpoints")
    elif part == "step":
        (run / "checkpoints" / "step-000001").rename(elsewhere / "step-000001")
        (run / "checkpoints" / "step-000001").symlink_to(elsewhere / "step-000001")
    elif part == "run":
        target = tmp_path / "link-to-run"
        target.symlink_to(run)
    elif part == "metrics":
        (run / "metrics.jsonl").symlink_to(elsewhere / "metrics.jsonl")
    else:
        (run / "checkpoints" / "step-000001" / "solver").mkdir()
        (run / "checkpoints" / "step-000001" / "solver" / "model.safetensors").symlink_to("/dev/zero")
    before = sorted(str(p) for p in elsewhere.rglob("*"))
    one_line_error(["run", "--resume", str(target)], "refused")
    assert sorted(str(p) for p in elsewhere.rglob("*")) == before  # nothing written through the link


@pytest.mark.parametrize("root", ["/", "/etc", "/usr/local/runs", "/proc/self", "/dev/shm/x", "/sys", "/boot"])
def test_a_system_directory_is_no_output_root(write_spec, tiny_ckpt, root):
    spec = minimal_spec(output_dir=root)
    spec["policies"]["solver"]["path"] = str(tiny_ckpt)
    one_line_error(["validate", str(write_spec(spec))], "output_dir", "refused")
    with pytest.raises(UserError, match="refused"):
        RunDir.create(root, "t", "", 0)


def test_a_symlink_to_root_is_no_output_root_either(tmp_path):
    (tmp_path / "root").symlink_to("/")
    with pytest.raises(UserError, match=r"\(= /\): a system directory"):
        check_output_root(tmp_path / "root" / ".")
    assert check_output_root(tmp_path / "runs") == tmp_path / "runs"


# ---------------------------------------------------------------------------------------------
# 5. an error names the file and the field, never the file's content


def test_a_spec_extending_a_secret_file_does_not_print_it(write_spec, tiny_ckpt, tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text(f"{SECRET}\ndaemon:*:19000:0:99999:7:::\n")
    spec = minimal_spec(extends=str(secret))
    spec["policies"]["solver"]["path"] = str(tiny_ckpt)
    err = one_line_error(["validate", str(write_spec(spec))], str(secret), "a key that is not a field name")
    assert "SECRET" not in err and "root:" not in err and "daemon" not in err and "19000" not in err


@pytest.mark.parametrize("text", [
    f"name: {json.dumps(SECRET)}\n",  # a value of a known field
    f"benchmark: {{name: {json.dumps(SECRET)}}}\n",  # a registry name
    "a: *Zq8SECRETHASHx1\n",  # an undefined alias
    "a: !Zq8SECRETHASHx1 x\n",  # an unknown tag
    f"train: {{steps: {json.dumps(SECRET)}}}\n",
])
def test_a_secret_value_is_not_echoed(write_spec, tiny_ckpt, text):
    spec = minimal_spec()
    spec["policies"]["solver"]["path"] = str(tiny_ckpt)
    lines = yaml.safe_dump({k: v for k, v in spec.items() if not text.startswith(k + ":")}) + text
    err = one_line_error(["validate", str(write_spec(lines))])
    assert "SECRET" not in err, err


def test_a_verify_line_with_a_secret_id_is_not_echoed(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"benchmark": "synthetic-arith", "id": SECRET, "response": "1"}) + "\n")
    err = one_line_error(["verify", "math", str(inp), "--out", str(tmp_path / "o.jsonl")], f"{inp}:1")
    assert "SECRET" not in err


def test_plain_names_are_still_quoted_with_a_hint(write_spec, tiny_ckpt):
    spec = minimal_spec(algorithm={"name": "grop"}, trian={})
    spec["policies"]["solver"]["path"] = str(tiny_ckpt)
    one_line_error(["validate", str(write_spec(spec))], "trian: unknown field; did you mean 'train'?")


# ---------------------------------------------------------------------------------------------
# 6-7. the judge: bounded frames, no hash-collision stall, no host path in the sandbox

sandbox_only = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")

_FORGE = '''
import fcntl, json, os, stat
def _result_fd():
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & 3 == 1:
                return fd
        except OSError:
            pass
def _send(body):
    data = len(body).to_bytes(4, "big") + body
    fd, view = _result_fd(), memoryview(data)
    while view:
        view = view[os.write(fd, view):]
'''


def _run_in_fresh_process(program: str, tests: list[str], timeout_s: float) -> dict:
    """run_tests in a new interpreter: its verdict, wall time and the largest process of the run
    (RUSAGE_CHILDREN: the judge, evaluator and candidate, all waited for)."""
    code = textwrap.dedent(f"""
        import json, resource, sys, time
        from mlmt_bench.verifiers import sandbox
        t0 = time.monotonic()
        r = sandbox.run_tests({program!r}, {tests!r}, limits=sandbox.Limits(timeout_s={timeout_s}, memory_mb=1024))
        print(json.dumps({{"status": r.status, "passed": r.passed, "details": r.details, "violation": r.violation,
                          "wall_s": time.monotonic() - t0,
                          "max_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@sandbox_only
def test_a_forged_frame_of_tiny_items_does_not_blow_up_the_judge():
    """A frame just under MAX_FRAME of ``0,0,0,...`` (8 million values) once made the judge build
    two 8-million-item lists (236 MB for 16 MiB; 399 MB and 16 s for 32 MiB): it is now refused
    from a count of its separators, before anything is built."""
    from mlmt_bench.verifiers.sandbox.judge import MAX_FRAME

    n = MAX_FRAME // 2 - 64
    program = _FORGE + (f"def f(x):\n    _send(b'{{\"t\":\"result\",\"id\":1,\"ok\":true,\"v\":[\"L\"' "
                        f"+ b',0' * {n} + b']}}')\n    return x\n")
    r = _run_in_fresh_process(program, ["assert f(1) == 1"], timeout_s=5)
    assert r["passed"] == [False] and "result too large to decode" in r["details"][0], r
    assert r["max_rss_mb"] < 150, r
    assert r["wall_s"] < 5 + 3, r


@sandbox_only
def test_a_forged_set_of_colliding_hashes_does_not_hold_the_judge():
    """200,000 distinct integers that all hash to 0 (multiples of 2**61 - 1) as a set: building it
    is quadratic, and held the judge 16 s past a 5 s limit. It is refused when decoded."""
    program = _FORGE + textwrap.dedent("""
        def f(x):
            P = (1 << 61) - 1
            _send(json.dumps({"t": "result", "id": 1, "ok": True,
                              "v": ["S"] + [["I", hex(k * P)] for k in range(1, 200_000)]}).encode())
            return x
        """)
    r = _run_in_fresh_process(program, ["assert f(1) == 1"], timeout_s=5)
    assert r["passed"] == [False] and "distinct keys with one hash value" in r["details"][0], r
    assert r["wall_s"] < 5 + 3, r


@sandbox_only
def test_a_test_stuck_on_colliding_values_is_cut_at_the_deadline():
    """An honest list of colliding integers that the test itself turns into a set: the evaluator is
    stuck in C code no deadline check reaches; the judge kills it EVAL_GRACE_S after its deadline."""
    from mlmt_bench.verifiers.sandbox.judge import EVAL_GRACE_S

    program = "def f(x):\n    P = (1 << 61) - 1\n    return [k * P for k in range(1, 200_000)]\n"
    r = _run_in_fresh_process(program, ["assert len(set(f(1))) == 3"], timeout_s=4)
    assert r["status"] == "timeout" and r["passed"] == [False], r
    assert r["wall_s"] < 4 + EVAL_GRACE_S + 3, r


@sandbox_only
def test_the_sandbox_command_line_shows_no_host_path():
    from mlmt_bench.verifiers import sandbox

    program = textwrap.dedent("""
        import sys
        cmd = open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode()
        print("SEEN", cmd, "|", " ".join(sys.orig_argv), "|", sys.executable, "|", sys.prefix, flush=True)
        def f(x):
            return x
        """)
    run = sandbox.run_tests(program, ["assert f(1) == 1"])
    assert run.passed == [True], run
    seen = run.stdout.split("SEEN ", 1)[1]
    venv = sys.prefix if sys.prefix != sys.base_prefix else str(REPO)
    for host in (str(REPO), "mlmt_bench", "sandbox/judge", "judge.py", ".venv", venv):
        assert host not in seen, (host, seen)
    assert "/dev/fd/" in seen  # the judge's script, passed as a descriptor
