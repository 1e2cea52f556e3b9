"""verify_file: the engine of `mlmt-bench verify VERIFIER IN.jsonl --out OUT.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mlmt_bench import registry
from mlmt_bench.benchmarks import data
from mlmt_bench.benchmarks.gpqa import GPQADiamond
from mlmt_bench.errors import UserError
from mlmt_bench.types import VERDICT_KINDS, Problem, Verdict
from mlmt_bench.verifiers.base import Verifier
from mlmt_bench.verifiers.io import verify_file


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(data.ENV_VAR, raising=False)


def _write(path: Path, lines: list[Any]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def test_inline_problems(tmp_path: Path) -> None:
    p = Problem(id="p1", benchmark="x", prompt="1+1?", answer="2").to_json()
    inp = _write(tmp_path / "in.jsonl", [
        {"problem": p, "response": "\\boxed{2}", "extra": 7},
        {"problem": p, "response": "it is 3"},
        "",
        {"problem": p, "response": "no idea"},
    ])
    out = tmp_path / "out.jsonl"
    summary = verify_file("math", inp, out)
    assert summary["n"] == 3 and summary["correct"] == 1
    assert summary["mean_reward"] == pytest.approx(1 / 3)
    rows = _read(out)
    assert [r["verdict"]["kind"] for r in rows] == ["ok", "wrong", "no_answer"], [r["verdict"] for r in rows]
    assert summary["kinds"]["ok"] == 1 and summary["kinds"]["wrong"] == 1 and summary["kinds"]["no_answer"] == 1
    assert set(summary["kinds"]) == set(VERDICT_KINDS)
    assert rows[0]["extra"] == 7 and rows[0]["problem"] == p and rows[0]["response"] == "\\boxed{2}"
    assert rows[0]["verdict"] == {"reward": 1.0, "correct": True, "extracted": "2", "kind": "ok",
                                  "detail": rows[0]["verdict"]["detail"]}
    assert not list(tmp_path.glob(".out.jsonl.*"))  # no temp file left


def test_benchmark_ids(tmp_path: Path) -> None:
    gp = GPQADiamond().all_problems()[:3]
    inp = _write(tmp_path / "in.jsonl", [
        {"benchmark": "math500", "id": "test/precalculus/807.json", "response": "\\boxed{(3,\\frac{\\pi}{2})}"},
        {"benchmark": "gsm8k", "id": "gsm8k/0", "response": "#### 18"},
        {"benchmark": "gsm8k", "id": 1, "response": "#### 1"},  # short id form
        *[{"benchmark": "gpqa-diamond", "id": p.id, "response": f"Answer: {p.answer}"} for p in gp],
    ])
    out = tmp_path / "out.jsonl"
    s_math = verify_file("math", inp, out)
    rows = _read(out)
    assert [r["verdict"]["correct"] for r in rows[:3]] == [True, True, False]
    assert s_math["n"] == 6
    s_choice = verify_file("choice", inp, out)
    assert [r["verdict"]["correct"] for r in _read(out)[3:]] == [True, True, True]
    assert s_choice["correct"] >= 3


def test_workers_parallel_same_result(tmp_path: Path) -> None:
    problems = GPQADiamond().all_problems()
    lines = [{"benchmark": "gpqa-diamond", "id": p.id, "response": f"The answer is ({'ABCD'[i % 4]})"}
             for i, p in enumerate(problems)]
    inp = _write(tmp_path / "in.jsonl", lines)
    a = verify_file("choice", inp, tmp_path / "a.jsonl")
    b = verify_file("choice", inp, tmp_path / "b.jsonl", workers=4)
    assert a == b and a["n"] == 198
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    m = verify_file("math", _write(tmp_path / "m.jsonl", [
        {"problem": Problem(id=str(i), benchmark="x", prompt="", answer=str(i)).to_json(),
         "response": f"\\boxed{{{i}.0}}"} for i in range(20)]), tmp_path / "m_out.jsonl", workers=2)
    assert m["correct"] == 20


@pytest.mark.parametrize(
    "line,message",
    [
        ("{not json", r"in\.jsonl:2: invalid JSON"),
        ("[1, 2]", r"in\.jsonl:2: expected a JSON object"),
        ('{"response": "x"}', r"in\.jsonl:2: needs either 'problem' or both 'benchmark' and 'id'"),
        ('{"benchmark": "math500", "id": "nope", "response": "x"}', r"in\.jsonl:2: benchmark 'math500' has no problem"),
        ('{"benchmark": "math5000", "id": "x", "response": "x"}', r"in\.jsonl:2: unknown benchmark 'math5000'"),
        ('{"problem": {"id": "a", "answer": "1"}}', r"in\.jsonl:2: 'response' must be a string"),
        ('{"problem": "a", "response": "x"}', r"in\.jsonl:2: 'problem' must be a Problem object"),
    ],
)
def test_bad_line(tmp_path: Path, line: str, message: str) -> None:
    good = {"problem": Problem(id="p", benchmark="x", prompt="", answer="1").to_json(), "response": "1"}
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps(good) + "\n" + line + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    out.write_text("previous results\n")
    with pytest.raises(UserError, match=message) as info:
        verify_file("math", inp, out)
    assert "\n" not in str(info.value)
    assert out.read_text() == "previous results\n"  # not clobbered
    assert sorted(x.name for x in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def test_unknown_verifier_and_paths(tmp_path: Path) -> None:
    inp = _write(tmp_path / "in.jsonl", [])
    with pytest.raises(UserError, match="unknown verifier"):
        verify_file("maths", inp, tmp_path / "o.jsonl")
    with pytest.raises(UserError, match="cannot read input"):
        verify_file("math", tmp_path / "missing.jsonl", tmp_path / "o.jsonl")
    with pytest.raises(UserError, match="does not exist"):
        verify_file("math", inp, tmp_path / "no" / "dir" / "o.jsonl")
    with pytest.raises(UserError, match="must differ"):
        verify_file("math", inp, inp)
    s = verify_file("math", inp, tmp_path / "o.jsonl")
    assert s["n"] == 0 and s["mean_reward"] == 0.0 and (tmp_path / "o.jsonl").read_text() == ""


class _Exploding(Verifier):
    name = "exploding"

    def score(self, problem: Problem, response: str) -> Verdict:
        if response == "boom":
            raise RuntimeError("verifier bug")
        return Verdict(1.0, True, response, "ok")


def test_failure_keeps_old_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.verifiers._entries, "exploding",
                        registry.Entry("exploding", _Exploding, "test verifier"))
    p = Problem(id="p", benchmark="x", prompt="", answer="1").to_json()
    inp = _write(tmp_path / "in.jsonl", [{"problem": p, "response": "a"}, {"problem": p, "response": "boom"}])
    out = tmp_path / "out.jsonl"
    out.write_text("old\n")
    with pytest.raises(RuntimeError):
        verify_file("exploding", inp, out)
    assert out.read_text() == "old\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def test_code_verifier_is_only_reached_through_the_registry() -> None:
    import mlmt_bench.verifiers.io as vio

    source = Path(vio.__file__).read_text()
    assert "verifiers.code" not in source and "CodeVerifier" not in source


def test_gzip_input_and_undecodable_bytes(tmp_path: Path) -> None:
    import gzip

    p = Problem(id="p1", benchmark="x", prompt="1+1?", answer="2").to_json()
    gz = tmp_path / "in.jsonl.gz"
    gz.write_bytes(gzip.compress((json.dumps({"problem": p, "response": "\\boxed{2}"}) + "\n").encode()))
    assert verify_file("math", gz, tmp_path / "out.jsonl")["correct"] == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(json.dumps({"problem": p, "response": "x"}).encode() + b"\n\xff\xfe\n")
    with pytest.raises(UserError, match=r"bad\.jsonl:2: corrupt data file: not valid UTF-8") as info:
        verify_file("math", bad, tmp_path / "out2.jsonl")
    assert "\n" not in str(info.value) and not (tmp_path / "out2.jsonl").exists()
