"""Faults and concurrency: what a run directory does when two processes want it, when the disk
fills up, when its newest checkpoint is corrupt or its spec was edited, and how many checkpoints
it keeps. Every refusal is one ``error:`` line and exit code 2 (``one_line_error``)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import minimal_spec
from mlmt_bench import registry, tracking
from mlmt_bench.cli import app
from mlmt_bench.errors import UserError
from mlmt_bench.io import checkpoint_state
from mlmt_bench.spec import load_run_spec
from mlmt_bench.tracking import RunDir
from support import one_line_error

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_torch_thread")

if "parity-test" not in registry.verifiers:  # rewards that vary, so that a training step changes the weights
    registry.verifiers.register("parity-test", "support:ParityVerifier", "parity of the response length (tests)",
                                overwrite=True)


def resume_ok(run: Path) -> str:
    """``run --resume`` in this process succeeds; returns its stderr."""
    res = CliRunner().invoke(app, ["-q", "run", "--resume", str(run)])
    assert res.exit_code == 0, (res.exit_code, res.stderr[-1500:], repr(res.exception))
    return res.stderr


def _spec(ckpt: Path, out: Path, **train) -> dict:
    d = minimal_spec(name="faults", output_dir=str(out))
    d["policies"]["solver"].update(path=str(ckpt), lr=3e-3)
    d["benchmark"] = {"name": "synthetic-arith", "eval_limit": 2, "verifier": "parity-test"}
    d["backend"] = {"max_new_tokens": 6}
    d["train"] = {"steps": 2, "problems_per_step": 4, "threads": 1, **train}  # 4: both steps update
    d["eval"] = {"every": 0, "feedback_metrics": False, "samples": 0, "final_samples": False}
    return d


def _write(tmp_path: Path, spec: dict) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _temporaries(run: Path) -> list[str]:
    return [str(p.relative_to(run)) for p in run.rglob("*") if ".tmp" in p.name]


@pytest.fixture(scope="module")
def finished_run(tiny_ckpt, tmp_path_factory) -> Path:
    """A completed two-step run with a checkpoint after each step (step-000001, step-000002)."""
    out = tmp_path_factory.mktemp("finished")
    from mlmt_bench import runner

    result = runner.run(load_run_spec(_write(out, _spec(tiny_ckpt, out / "runs", checkpoint_every=1))), progress=False)
    return Path(result["run_dir"])


@pytest.fixture
def killed_run(finished_run, tmp_path) -> Path:
    """A copy of ``finished_run`` as a kill leaves it: status running."""
    run = tmp_path / finished_run.name
    shutil.copytree(finished_run, run)
    (run / ".lock").unlink(missing_ok=True)
    m = _manifest(run)
    m.update(status="running", end_time=None)
    (run / "manifest.json").write_text(json.dumps(m, indent=2))
    return run


# ---------------------------------------------------------------------------------------------
# 1. one process per run directory


def test_a_second_process_cannot_resume_a_run_directory_in_use(killed_run):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from mlmt_bench.tracking import RunDir; r = RunDir(sys.argv[1]); "
         "r.lock(); print('locked', flush=True); sys.stdin.read()", str(killed_run)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = (killed_run / "metrics.jsonl").read_bytes()
        one_line_error(["run", "--resume", str(killed_run)], f"in use by process {holder.pid}")
        assert (killed_run / "metrics.jsonl").read_bytes() == before and _manifest(killed_run)["status"] == "running"
    finally:
        holder.stdin.close()
        holder.wait()
    lock = RunDir(killed_run)
    lock.lock()  # the holder is gone: the kernel released its lock
    lock.unlock()


def test_a_run_holds_its_directory_while_it_trains_and_then_lets_go(tiny_ckpt, tmp_path):
    """The lock is taken at creation and dropped at the end, so one process can run several runs
    one after another (the experiment's workers); ``keep_checkpoints`` prunes as it goes."""
    from mlmt_bench import runner

    refusals = []

    def on_eval(record):
        (run,) = (tmp_path / "runs").iterdir()
        with pytest.raises(UserError, match=f"in use by process {os.getpid()}") as exc:
            RunDir(run).lock()  # flock: a second open file conflicts even within one process
        refusals.append(str(exc.value))

    spec = load_run_spec(_write(tmp_path, _spec(tiny_ckpt, tmp_path / "runs", steps=3, checkpoint_every=1,
                                                keep_checkpoints=2)))
    run = Path(runner.run(spec, progress=False, on_eval=on_eval)["run_dir"])
    assert refusals and _manifest(run)["status"] == "completed"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
    again = RunDir(run)
    again.lock()
    again.unlock()


# ---------------------------------------------------------------------------------------------
# 2. a full disk


class _FullDisk:
    """From :meth:`fill` on, new files get no bytes (``tempfile.mkstemp`` hands out /dev/full) and
    appends fail with ENOSPC; bytes already on disk can still be overwritten, as on a real disk."""

    def __init__(self, monkeypatch) -> None:
        self.full = False
        real_mkstemp, real_write = tracking.tempfile.mkstemp, tracking.JsonlWriter.write

        def mkstemp(*args, **kwargs):
            fd, name = real_mkstemp(*args, **kwargs)
            if self.full:
                dev = os.open("/dev/full", os.O_WRONLY)
                os.dup2(dev, fd)
                os.close(dev)
            return fd, name

        def write(writer, record):
            if self.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_write(writer, record)

        monkeypatch.setattr(tracking.tempfile, "mkstemp", mkstemp)
        monkeypatch.setattr(tracking.JsonlWriter, "write", write)

    def fill(self) -> OSError:
        self.full = True
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["metrics", "checkpoint"])
def test_a_full_disk_is_one_line_the_run_marked_failed_and_no_temporary_left(tiny_ckpt, tmp_path, monkeypatch,
                                                                            where):
    disk = _FullDisk(monkeypatch)
    if where == "metrics":
        real_write = tracking.JsonlWriter.write

        def write(writer, record):
            if record.get("kind") == "train":
                disk.fill()
            real_write(writer, record)

        monkeypatch.setattr(tracking.JsonlWriter, "write", write)
    else:
        def save_state(directory, state):
            (Path(directory) / checkpoint_state.STATE_FILE).write_bytes(b"half a file")
            raise disk.fill()

        monkeypatch.setattr(checkpoint_state, "save_state", save_state)
    spec = _write(tmp_path, _spec(tiny_ckpt, tmp_path / "runs", checkpoint_every=1))
    one_line_error(["-q", "run", str(spec)], "no space left on device", "the run is marked failed", "--resume",
                   after_warnings=True)
    (run,) = (tmp_path / "runs").iterdir()
    assert _manifest(run)["status"] == "failed" and _manifest(run)["end_time"]
    assert _temporaries(run) == []
    if where == "checkpoint":
        assert list((run / "checkpoints").iterdir()) == []  # the unfinished one was removed
    RunDir(run).lock()  # released although the run ended in an error


def test_the_manifest_is_marked_in_place_when_no_new_file_can_be_written(tmp_path, monkeypatch):
    run = RunDir.create(tmp_path, "x", "name: x\n", seed=0)
    _FullDisk(monkeypatch).fill()
    with pytest.raises(OSError):
        tracking.atomic_write_text(run.path / "other.json", "{}")
    run.finish("failed")
    assert run.manifest()["status"] == "failed" and run.manifest()["seed"] == 0
    assert _temporaries(run.path) == [] and not (run.path / "other.json").exists()


def test_a_full_disk_while_report_writes_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """`report`'s disk-full error was 'error: no space left on device', naming no file (a write or
    fsync that finds no space names none); it names the file it was writing, and leaves no temporary."""
    from support import make_run

    run = make_run(tmp_path / "exp", "toy-grpo-s0-20250101T000000Z", seed=0, arm="grpo",
                   curve=[(0, 0, 0.0, .25, .25), (10, 1000, 1e12, .5, .5)], t1=[1, 1, 0, 0], t2=[1, 1, 1, 0])
    out = tmp_path / "out"
    out.mkdir()
    _FullDisk(monkeypatch).fill()
    err = one_line_error(["report", str(run), "--out", str(out)], "no space left on device")
    written = err.removeprefix("error: ").removesuffix(": no space left on device\n")
    assert Path(written).parent == out and Path(written).name in ("acc_vs_tokens.png", "comparison.md"), err
    assert _temporaries(out) == []


# ---------------------------------------------------------------------------------------------
# 3. a corrupt newest checkpoint


def _truncate_state(step: Path) -> None:
    path = step / checkpoint_state.STATE_FILE
    path.write_bytes(path.read_bytes()[:-100])


def _truncate_weights(step: Path) -> None:
    path = step / "solver" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def _rewrite_weights(step: Path, edit) -> None:
    """The solver's weights of ``step`` replaced by ``edit(tensors)`` (issue 34: weights that do not fit)."""
    from safetensors.torch import load_file, save_file

    path = step / "solver" / "model.safetensors"
    tensors = load_file(str(path))
    save_file(edit(dict(tensors)), str(path), metadata={"format": "pt"})


def _wrong_shape(t: dict) -> dict:
    k = next(k for k in sorted(t) if t[k].dim() == 2)
    return {**t, k: t[k][:-1].contiguous()}


def _with_extra(t: dict) -> dict:
    return {**t, "extra.weight": t[min(t)].clone()}


def _state_of_step_1(step: Path) -> None:
    """A step-1 trainer state planted in step-000002 (it would resume at the wrong step)."""
    shutil.copy(step.parent / "step-000001" / checkpoint_state.STATE_FILE, step / checkpoint_state.STATE_FILE)


@pytest.mark.parametrize("corrupt", [_truncate_state, _truncate_weights,
                                     lambda step: shutil.rmtree(step / "solver"),
                                     lambda step: _rewrite_weights(step, _wrong_shape),
                                     lambda step: _rewrite_weights(step, _with_extra),
                                     lambda step: _rewrite_weights(step, lambda t: {k: v for k, v in t.items()
                                                                                   if k != sorted(t)[0]}),
                                     lambda step: _rewrite_weights(step, lambda t: {k: v.half() for k, v in t.items()}),
                                     _state_of_step_1],
                         ids=["truncated-state", "truncated-weights", "missing-weights", "wrong-shape", "extra-tensor",
                              "missing-tensor", "float16", "state-of-another-step"])
def test_resume_falls_back_to_the_newest_intact_checkpoint(finished_run, killed_run, corrupt):
    from safetensors.torch import load_file

    corrupt(killed_run / "checkpoints" / "step-000002")
    (killed_run / "checkpoints" / "step-zzz").mkdir()  # not a checkpoint: ignored
    err = resume_ok(killed_run)
    warnings = [line for line in err.splitlines() if line.startswith("warning:") and "checkpoint" in line]
    assert len(warnings) == 1 and "resuming from step-000001" in warnings[0] and "skipped 1" in warnings[0], err
    m = _manifest(killed_run)
    assert m["status"] == "completed" and m["resumed_from"] == ["step-000001"]
    train = [r["step"] for r in map(json.loads, (killed_run / "metrics.jsonl").read_text().splitlines())
             if r["kind"] == "train"]
    assert train == [1, 2]  # step 2 redone once, from step 1
    one, two, redone = (load_file(str(run / "checkpoints" / step / "solver" / "model.safetensors")) for run, step in
                        ((finished_run, "step-000001"), (finished_run, "step-000002"), (killed_run, "step-000002")))
    assert any(not one[k].equal(two[k]) for k in one)  # the step changed the weights ...
    assert redone.keys() == two.keys() and all(redone[k].equal(two[k]) for k in two)  # ... exactly as the first time


@pytest.mark.parametrize("started_with", ["this code", "other code", "no record"])
def test_a_resume_records_its_code_and_warns_when_the_run_started_with_other_code(killed_run, started_with):
    """The manifest's ``code`` (mlmt-bench's source sha256) from the start; each resume appends its own to
    ``resumed_code`` and, when the start's differs, warns that what follows the checkpoint is this code's."""
    from mlmt_bench.tracking import code_fingerprint

    m = _manifest(killed_run)
    assert m["code"] == code_fingerprint()
    if started_with == "other code":
        m["code"] = "0" * 64
    elif started_with == "no record":
        del m["code"]
    (killed_run / "manifest.json").write_text(json.dumps(m, indent=2))
    err = resume_ok(killed_run)
    warned = [line for line in err.splitlines() if "started with other mlmt-bench code" in line]
    if started_with == "other code":
        assert warned == [f"warning: this run started with other mlmt-bench code (source sha256 000000000000, this one "
                          f"{code_fingerprint()[:12]}); what it computes after step-000002 comes from this code, with "
                          "its defaults for any setting the run's spec.resolved.yaml does not name (manifest: "
                          "resumed_code)"]
    else:
        assert warned == []
    assert _manifest(killed_run)["resumed_code"] == [code_fingerprint()]


def test_resume_with_no_intact_checkpoint_is_one_line(killed_run):
    for step in ("step-000001", "step-000002"):
        _truncate_state(killed_run / "checkpoints" / step)
    one_line_error(["run", "--resume", str(killed_run)], "no intact checkpoint", "step-000002",
                   "unreadable checkpoint state")
    assert _manifest(killed_run)["status"] == "running"


@pytest.mark.parametrize("where", ["generating", "between its rows and its record"])
def test_a_crash_in_the_final_evaluation_resumes_into_it_without_redoing_a_step(finished_run, tiny_ckpt, tmp_path,
                                                                                 monkeypatch, where):
    """The checkpoint of a step is saved before its evaluation: a run that dies while evaluating its
    last step resumes from that step's checkpoint and only evaluates (a final evaluation can take
    longer than several steps); the logs then equal an uninterrupted run's, every record and every
    per-problem row once, also when it died after writing the evaluation's rows but before its
    metrics record (written last: the resume drops those rows and evaluates again)."""
    from mlmt_bench import runner
    from mlmt_bench.tracking import RunDir
    from mlmt_bench.trainer import Trainer

    target, attr = (Trainer, "_evaluate_once") if where == "generating" else (RunDir, "log_metrics")
    real = getattr(target, attr)

    def dies_at_step_2(self, *args, **kwargs):
        step = self.counters.step if where == "generating" else args[0].get("step")
        if step == 2 and (where == "generating" or args[0].get("kind") == "eval"):
            raise RuntimeError("the machine went away")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(target, attr, dies_at_step_2)
    out = tmp_path / "runs"
    with pytest.raises(RuntimeError, match="went away"):
        runner.run(load_run_spec(_write(tmp_path, _spec(tiny_ckpt, out, checkpoint_every=1))), progress=False)
    (run,) = out.iterdir()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
    rows_at_2 = [r for r in map(json.loads, (run / "eval_problems.jsonl").read_text().splitlines()) if r["step"] == 2]
    assert len(rows_at_2) == (0 if where == "generating" else 2)  # eval_limit 2
    monkeypatch.setattr(target, attr, real)
    resume_ok(run)
    assert _manifest(run)["resumed_from"] == ["step-000002"]

    def records(r: Path) -> list[tuple]:
        return [(m["kind"], m["step"], m.get("acc@t2"), m.get("gen_tokens"))
                for m in map(json.loads, (r / "metrics.jsonl").read_text().splitlines())]

    def rows(r: Path) -> list[str]:
        return (r / "eval_problems.jsonl").read_text().splitlines()

    assert records(run) == records(finished_run)  # train 1, 2 once; eval 0, 2 once; final
    assert [k for k, *_ in records(run)] == ["eval", "train", "train", "eval", "final"]
    assert rows(run) == rows(finished_run) and len(rows(run)) == 4  # 2 problems at steps 0 and 2, once each


# ---------------------------------------------------------------------------------------------
# 4. an edited spec.resolved.yaml


def test_resume_refuses_an_edited_spec_without_showing_it(killed_run):
    spec = killed_run / "spec.resolved.yaml"
    d = yaml.safe_load(spec.read_text())
    d["policies"]["solver"]["lr"] = float("inf")
    d["seed"] = 12345
    spec.write_text(yaml.safe_dump(d))
    err = one_line_error(["run", "--resume", str(killed_run)], "spec.resolved.yaml: changed since the run started")
    assert ".inf" not in err and "12345" not in err


def test_a_run_from_before_spec_hashes_resumes_with_a_warning_and_is_checked_from_then_on(killed_run):
    m = _manifest(killed_run)
    want = m.pop("spec_sha256")
    (killed_run / "manifest.json").write_text(json.dumps(m))
    err = resume_ok(killed_run)
    assert "records no spec_sha256" in err and err.count("warning:") == 1, err
    assert _manifest(killed_run)["spec_sha256"] == want


# ---------------------------------------------------------------------------------------------
# 5. train.keep_checkpoints


def test_keep_checkpoints_must_be_at_least_one(tiny_ckpt, tmp_path):
    with pytest.raises(UserError, match="keep_checkpoints"):
        load_run_spec(_write(tmp_path, _spec(tiny_ckpt, tmp_path, keep_checkpoints=0)))
    assert load_run_spec(_write(tmp_path, _spec(tiny_ckpt, tmp_path))).train.keep_checkpoints is None


def test_pruning_keeps_the_newest_at_or_before_the_committed_step(tmp_path):
    run = RunDir.create(tmp_path, "x", "", seed=0)
    for step in range(1, 7):
        run.commit_checkpoint(run.begin_checkpoint(step), step)
    run.prune_checkpoints(None, 6)
    assert len(list(run.iter_checkpoints())) == 6
    run.prune_checkpoints(2, 4)  # resumed from step 4: the skipped later ones are not "newest"
    assert [p.name for p in run.iter_checkpoints()] == ["step-000003", "step-000004", "step-000005", "step-000006"]


@pytest.mark.parametrize("command", ["run", "report"])
def test_a_folder_this_user_cannot_write_is_one_line_naming_it_and_the_user(tiny_ckpt, tmp_path, monkeypatch,
                                                                           command):
    # As a non-root container user meets a bind mount that dockerd created as root. The tests may
    # run as root, whom permissions do not stop, so the refusal is made by the file system call.
    out = tmp_path / "root-owned"
    out.mkdir()
    real_mkdir = Path.mkdir

    def mkdir(path, *args, **kwargs):
        if out in path.parents:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    if command == "run":
        args = ["-q", "run", str(_write(tmp_path, _spec(tiny_ckpt, out)))]
    else:
        args = ["-q", "report", str(REPO / "reports" / "testbed-v3"), "--out", str(out / "report")]
    err = one_line_error(args, str(out), f"permission denied for this process (uid {os.getuid()})")
    assert "Traceback" not in err
    assert list(out.iterdir()) == []


def test_a_full_disk_while_weights_are_written_is_one_line(tiny_ckpt, tmp_path, monkeypatch):
    """safetensors reports a full disk as its own error (issue 34: a 55-68-line SafetensorError traceback at
    1-24 MB tmpfs sizes); it is the run's one 'no space left' line, with nothing half-written left."""
    from safetensors import SafetensorError

    from mlmt_bench.models.policy import Policy

    real_save = Policy.save

    def save(policy, directory, state_dict=None):
        real_save(policy, directory, state_dict)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(Policy, "save", save)
    spec = _write(tmp_path, _spec(tiny_ckpt, tmp_path / "runs", checkpoint_every=1))
    one_line_error(["-q", "run", str(spec)], "no space left on device", "the run is marked failed", "--resume",
                   after_warnings=True)
    (run,) = (tmp_path / "runs").iterdir()
    assert _manifest(run)["status"] == "failed"
    assert _temporaries(run) == [] and not list((run / "checkpoints").iterdir())
