"""The feedback perturbation probe (METHOD v4, issue 31): each benchmark's edits of a feedback,
the probe's table on scripted policies (hand-computed), its CLI, the end-of-run probe.json, and the
shipped seed-10 base, whose refinement reads the last value of the feedback (the audit's table)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlmt_bench.benchmarks.base import Benchmark
from mlmt_bench.benchmarks.mbpp import MBPP
from mlmt_bench.benchmarks.perturbations import (
    PROBE_ROWS,
    choice_perturbations,
    code_perturbations,
    math_perturbations,
    numbers,
    replace_new_numbers,
    same_value,
    shift_last_number,
)
from mlmt_bench.benchmarks.synthetic import (
    SyntheticArith,
    approve_all,
    feedback_edits,
    format_solution,
    oracle_feedback,
)
from mlmt_bench.probe import markdown, probe_feedback, row_metrics, table_rows
from mlmt_bench.rollout.backend import Generation
from mlmt_bench.rollout.episodes import Actors, Sampling
from mlmt_bench.types import Problem
from mlmt_bench.verifiers.synthetic import SyntheticVerifier

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _arith(prompt: str, steps: list[tuple[int, str, int, int]]) -> Problem:
    return Problem("p", "synthetic-arith", prompt, str(steps[-1][3]),
                   metadata={"steps": [list(s) for s in steps], "solution": format_solution(steps), "modulus": 100})


P = _arith("9-6+9+1", [(9, "-", 6, 3), (3, "+", 9, 12), (12, "+", 1, 13)])


# --------------------------------------------------------------------------- the edits, by hand


def test_synthetic_edits_replace_shift_and_approve_the_values_after_the_mark():
    attempt = "9-6=3;3+9=11;11+1=12;#12"
    feedback = "9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong"
    assert feedback_edits(P, attempt, feedback) == {
        "values_removed": "9-6>3 9-6=3 ok;3+9>11 3+9=11 wrong",  # each > value: the attempt's result at that step
        "last_shifted": "9-6>3 9-6=3 ok;3+9>13 3+9=11 wrong",
        "approve_gold": "9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>13 12+1=13 ok;answer ok",
        "approve_own": "9-6>3 9-6=3 ok;3+9>11 3+9=11 ok;11+1>12 11+1=12 ok;answer ok",
    }
    # a corrected final line: its value is supplied too; a missing step takes the attempt's final answer
    done = "9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>13 12+1=13 ok;answer wrong: #13"
    edits = feedback_edits(P, "9-6=3;3+9=12;#20", done)
    assert edits["values_removed"] == "9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;12+1>20 12+1=13 ok;answer wrong: #20"
    assert edits["last_shifted"] == done.replace("#13", "#14")
    assert edits["approve_own"] == "9-6>3 9-6=3 ok;3+9>12 3+9=12 ok;answer ok"
    # nothing to shift: unchanged; an unreadable attempt approves only the answer
    assert feedback_edits(P, "garbage", "check again")["last_shifted"] == "check again"
    assert feedback_edits(P, "garbage", "check again")["approve_own"] == "answer ok"


def test_synthetic_rows_add_the_oracle_and_state_the_recomputed_values():
    bench = SyntheticArith()
    attempt = "9-6=3;3+9=11;11+1=12;#12"
    rows = bench.feedback_perturbations(P, attempt, "9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong")
    assert set(rows) == set(PROBE_ROWS) - {"own", "null"}
    assert rows["oracle"] == oracle_feedback(P, attempt) == "9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong"
    # the values a feedback supplies: after > and #, not the operands or the attempt's quoted results
    assert bench.stated_values("9-6>3 9-6=3 ok;3+9>12 3+9=11 wrong") == ["3", "12"]
    assert bench.stated_values("answer wrong: #07") == ["7"]
    assert bench.stated_values("check again") == []


def test_numbers_are_read_whole_with_signs_only_where_no_operand_precedes():
    assert numbers("x = -3, so 5-3=2; 1,234.5 and .5 or 3/4") == ["-3", "5", "3", "2", "1,234.5", ".5", "3/4"]
    assert same_value("1,234.50", "1234.5") and same_value("0.75", "3/4") and not same_value("12", "13")
    assert same_value("\\pi", "\\pi") and not same_value("\\pi", "3")
    assert shift_last_number("12 apples, then 14.") == "12 apples, then 15."
    assert shift_last_number("half is 1/2") == "half is 1.5" and shift_last_number("no numbers") == "no numbers"
    assert replace_new_numbers("3+4 is 8, not 7; so 15", ["3", "4", "7"], "7") == "3+4 is 7, not 7; so 7"
    assert replace_new_numbers("it is 8", ["3"], None) == "it is "


def test_math_edits_keep_the_problems_and_the_attempts_numbers():
    rows = math_perturbations("Tom has 3 apples and buys 4.", "3 + 4 = 8, so \\boxed{8}",
                              "3 + 4 is 7, not 8: the answer is 7.", "7", "8")
    assert rows == {"values_removed": "3 + 4 is 8, not 8: the answer is 8.",  # the supplied 7s: the attempt's 8
                    "last_shifted": "3 + 4 is 7, not 8: the answer is 8.",
                    "approve_gold": "Every step is correct. The final answer 7 is correct.",
                    "approve_own": "Every step is correct. The final answer 8 is correct.",
                    "oracle": None}
    assert math_perturbations("x", "y", "so 9", None, None)["values_removed"] == "so "  # no answer: removed
    assert math_perturbations("x", "y", "so 9", None, None)["approve_gold"] is None


def test_choice_edits_treat_option_letters_as_the_values():
    rows = choice_perturbations("A bond forms. (B) is wrong; C is right.", "C", "B")
    assert rows["values_removed"] == "A bond forms. (B) is wrong; B is right."  # the article A is no option
    assert rows["last_shifted"] == "A bond forms. (B) is wrong; D is right."
    assert choice_perturbations("D fits", "A", None)["last_shifted"] == "A fits"  # D -> A
    assert rows["approve_gold"].endswith("(C) is correct.") and rows["approve_own"].endswith("(B) is correct.")


def test_code_edits_drop_code_and_approve_with_the_reference():
    rows = code_perturbations("Use `x+1`:\n```python\nreturn x+1\n```\nthen it works.", "def f(x):\n    return x")
    assert rows["values_removed"] == "Use :\n\nthen it works."
    assert rows["approve_gold"].endswith("```python\ndef f(x):\n    return x\n```")
    assert rows["last_shifted"] is None and rows["oracle"] is None
    assert MBPP().stated_values("```python\nx\n```") is None  # code states no value the probe compares


def test_a_benchmark_that_declares_nothing_applies_no_edit():
    assert Benchmark().feedback_perturbations(P, "z", "g") == dict.fromkeys(
        ("values_removed", "last_shifted", "approve_gold", "approve_own", "oracle"))
    assert Benchmark().stated_values("7") is None


def test_row_metrics_by_hand():
    r = row_metrics([True, False, True, True], [False, False, True, True], [True, True, False, True],
                    [True, False, False, True], [True, False, False, False], [0.5, 0.0, 0.25, 0.25])
    assert r == {"n": 4, "acc@t2": 0.75, "acc@t1": 0.5, "delta": 0.25, "copy_rate": 0.75, "copy_last_rate": 0.5,
                 "edited": 0.25, "redacted_share": 0.25}
    assert row_metrics([True], [True], [None], [None], [False], None)["copy_rate"] is None


# --------------------------------------------------------------------------- the probe on scripted policies


class _Role:
    """A scripted policy: ``model`` is a function of the decoded prompt."""

    def __init__(self, script, tokenizer):
        self.model, self.tokenizer = script, tokenizer


class _ScriptBackend:
    def __init__(self):
        self.calls = 0

    def generate(self, model, tokenizer, prompts, **_):
        self.calls += 1
        out = []
        for p in prompts:
            text = model(tokenizer.decode(p))
            ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
            out.append(Generation(ids, [0.0] * len(ids), "stop", text))
        return out


def _wrong(p):
    """``p``'s gold solution with a wrong last step (its result + 5, mod 100) and final line."""
    steps = [tuple(x) for x in p.metadata["steps"]]
    a, op, b, r = steps[-1]
    return format_solution([*steps[:-1], (a, op, b, (r + 5) % 100)])


def _scripted(problems):
    """Even-indexed attempts right, odd ones :func:`_wrong`; a blind critic that approves every
    attempt with its own values; a solver that refines by copying the last value after > or # in
    the feedback (a ``?`` or none: it keeps its answer)."""
    from mlmt_bench.models.tokenizer import build_char_tokenizer

    attempts = {p.prompt: _wrong(p) if k % 2 else p.metadata["solution"] for k, p in enumerate(problems)}

    def find(text):
        return min((text.index(p.prompt), p.prompt) for p in problems if p.prompt in text)[1]

    def solver(text):
        z = attempts[find(text)]
        if "feedback: " not in text:
            return z
        marks = re.findall(r"[>#]\s*(\d+|\?)", text.rsplit("feedback: ", 1)[1])
        return f"#{marks[-1]}" if marks and marks[-1] != "?" else z[z.index("#"):]

    def critic(text):
        steps = [(int(a), op, int(b), int(r)) for a, op, b, r in
                 re.findall(r"(\d+)([+\-*])(\d+)=(\d+)", attempts[find(text)])]
        return approve_all(steps)

    tok = build_char_tokenizer()
    return _Role(solver, tok), _Role(critic, tok), attempts


def _clean_problems(n):
    """Test problems whose gold answer, and each attempt's answer + 1, occur in neither the problem
    nor either scripted attempt (so that a rule that redacts values not in x or z redacts them)."""
    out = []
    for p in SyntheticArith().load("test"):
        x, right, wrong, gold = numbers(p.prompt), numbers(p.metadata["solution"]), numbers(_wrong(p)), int(p.answer)
        shifted_wrong = str((gold + 5) % 100 + 1)
        if len(out) < n and str(gold + 1) not in x + right and not {str(gold), shifted_wrong} & {*x, *wrong}:
            out.append(p)
    return out


def _run(problems, redact=False, oracle=None):
    solver, critic, attempts = _scripted(problems)
    backend = _ScriptBackend()
    bench = SyntheticArith()
    actors = Actors(solver, critic, backend, bench.templates, SyntheticVerifier())
    sampling = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=40, feedback_max_new_tokens=80)
    return probe_feedback(bench, actors, problems, sampling, redact=redact, chunk=5, oracle=oracle), backend


def test_the_oracle_row_can_be_given_in_the_form_the_critic_was_taught():
    """A worked warm start's refiner learnt the worked oracle's form: the probe asks it that form."""
    problems = _clean_problems(4)
    seen = []

    def oracle(problem, attempt):
        seen.append(problem.id)
        return "Verdict: incorrect"  # states no value: the copying solver keeps its answer

    res, _ = _run(problems, oracle=oracle)
    assert seen == [p.id for p in problems]
    assert res["rows"]["oracle"]["acc@t2"] == 0.5 and res["rows"]["oracle"]["edited"] == 1.0
    assert _run(problems)[0]["rows"]["oracle"]["acc@t2"] == 1.0  # the benchmark's own oracle, copied


def test_runs_probe_the_worked_oracle_only_after_a_worked_warm_start():
    from mlmt_bench.benchmarks.nl_arith import NLArith
    from mlmt_bench.runner import probe_oracle

    class _Spec:
        warm_start = {"model": "m", "critique": "worked"}

    bench = NLArith()
    assert probe_oracle(_Spec(), bench) == bench.worked_feedback
    _Spec.warm_start = {"model": "m"}
    assert probe_oracle(_Spec(), bench) is None
    _Spec.warm_start = None
    assert probe_oracle(_Spec(), bench) is None


def test_the_probe_on_a_copying_solver_and_a_blind_critic_by_hand():
    problems = _clean_problems(8)
    res, backend = _run(problems)
    assert res["n"] == 8 and res["acc@t1"] == 0.5 and res["redact"] is False
    acc = {row: r["acc@t2"] for row, r in res["rows"].items()}
    # blind approval states each attempt's own answer; shifting it by one breaks every one; the
    # gold values and the oracle's correction are copied; g∅ states nothing, so the answer stays
    assert acc == {"own": 0.5, "values_removed": 0.5, "last_shifted": 0.0, "approve_gold": 1.0,
                   "approve_own": 0.5, "oracle": 1.0, "null": 0.5}
    rows = res["rows"]
    assert rows["own"]["copy_rate"] == 1.0 and rows["null"]["copy_rate"] == 0.0
    assert rows["last_shifted"]["copy_last_rate"] == 1.0 and rows["last_shifted"]["delta"] == -0.5
    assert rows["own"]["edited"] == 0.0 and rows["approve_own"]["edited"] == 0.0  # the blind critic's own text
    assert rows["last_shifted"]["edited"] == 1.0 and rows["oracle"]["edited"] == 0.5  # the oracle differs on wrong ones
    # identical attempts: one attempt pass, one critic pass, the refinements of 7 rows x 8 problems in chunks of 5
    assert backend.calls == 2 + -(-7 * 8 // 5)
    assert [r["problem_id"] for r in res["per_problem"]] == [p.id for p in problems]
    assert [r["t1"] for r in res["per_problem"]] == [True, False] * 4
    header, table = table_rows(res)
    assert header[:3] == ["feedback given to the refiner", "n", "acc@t2"]
    assert [row[2] for row in table] == ["50.0%", "50.0%", "0.0%", "100.0%", "50.0%", "100.0%", "50.0%"]
    assert "| own: the critic's own | 8 | 50.0% | +0.0 |" in markdown(res)


def test_redaction_closes_the_channel_for_shifted_and_gold_values():
    problems = _clean_problems(8)
    res, _ = _run(problems, redact=True)
    acc = {row: r["acc@t2"] for row, r in res["rows"].items()}
    # the shifted and the gold values occur in neither x nor z: redacted, the solver keeps its answer
    assert acc["own"] == acc["last_shifted"] == acc["approve_gold"] == 0.5
    assert res["rows"]["own"]["redacted_share"] == 0.0  # the blind critic only quotes the attempt
    assert res["rows"]["approve_gold"]["redacted_share"] > 0
    assert "redacted" in table_rows(res)[0]


# --------------------------------------------------------------------------- the CLI and the end-of-run probe


def test_the_cli_writes_the_table_and_refuses_bad_input(tiny_ckpt, write_spec, tmp_path):
    from conftest import minimal_spec
    from mlmt_bench.cli import app

    spec = minimal_spec(policies={"solver": {"model": "tiny", "path": str(tiny_ckpt)}},
                        backend={"max_new_tokens": 8, "feedback_max_new_tokens": 8})
    path = write_spec(spec)
    out = tmp_path / "probe"
    res = CliRunner().invoke(app, ["-q", "probe", "feedback", str(path), "--limit", "3", "--split", "validation",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "probe.json").read_text())
    assert data["n"] == 3 and data["split"] == "validation" and data["critic"] == "base"  # grpo has no critic
    assert list(data["rows"]) == list(PROBE_ROWS) and data["rows"]["own"]["n"] == 3
    assert "--limit 3" in data["command"]
    assert "| null: g∅" in (out / "probe.md").read_text()
    before = (out / "probe.json").read_bytes()
    again = CliRunner().invoke(app, ["probe", "feedback", str(path), "--limit", "3", "--out", str(out)])
    assert again.exit_code == 2 and "already holds probe.json, probe.md" in again.output, again.output
    assert (out / "probe.json").read_bytes() == before  # an earlier probe's record is never overwritten
    bad = CliRunner().invoke(app, ["probe", "feedback", str(path), "--split", "nope"])
    assert bad.exit_code == 2 and "unknown split 'nope'" in bad.output


def test_a_run_with_a_critic_writes_probe_json_and_one_without_does_not(tiny_ckpt, tmp_path):
    from mlmt_bench import runner
    from mlmt_bench.tracking import RunDir
    from support import make_spec

    spec = make_spec(tmp_path, tiny_ckpt, "mlmt", {"group_size": 2}, train={"steps": 1, "problems_per_step": 1})
    spec.eval.probe_problems = 2
    run = Path(runner.run(spec, progress=False)["run_dir"])
    probe = json.loads((run / "probe.json").read_text())
    assert probe["n"] == 2 and probe["split"] == "validation" and probe["critic"] == "final" and probe["step"] == 1
    # the same policies probed from the run directory (`mlmt-bench probe feedback RUN_DIR`): its final checkpoint
    again = runner.probe_from_run_dir(run, split="validation", limit=2, progress=False)
    assert again["critic"] == "run" and again["step"] == 1 and again["run_dir"] == str(run)
    assert {r: again["rows"][r]["acc@t2"] for r in PROBE_ROWS} == {r: probe["rows"][r]["acc@t2"] for r in PROBE_ROWS}
    grpo = make_spec(tmp_path, tiny_ckpt, "grpo", train={"steps": 1, "problems_per_step": 1})
    grpo.eval.probe_problems = 2
    trainer = runner.make_trainer(grpo, runner.build(grpo, progress=False), RunDir.create(tmp_path, "g", "", 0))
    assert trainer.after_train is None  # no critic: no probe
    spec.eval.probe_problems = 0
    assert runner.end_of_run_probe(spec, SyntheticArith()) is None  # the default: none


# --------------------------------------------------------------------------- the shipped seed-10 base


def _shipped_base_actors():
    from mlmt_bench.models.tiny import load_checkpoint
    from mlmt_bench.rollout.hf_backend import HFBackend
    from mlmt_bench.warmstart.shared_base import BaseConfig
    from mlmt_bench.warmstart.shipped_bases import SHIPPED_DIR

    def config(entry):
        return BaseConfig.model_validate(json.loads((entry / "base.json").read_text())["config"])

    # the seed-10 base (its key depends on the CPU pin in this process's environment: found by its config)
    entry = next(d for d in SHIPPED_DIR.iterdir() if config(d) == BaseConfig(seed=10))
    model, tok = load_checkpoint(entry / "model")
    bench = SyntheticArith()
    policy = _Role(model, tok)
    return bench, Actors(policy, policy, HFBackend(), bench.templates, SyntheticVerifier())


def test_the_shipped_base_refines_by_copying_the_last_value():
    """The direction of the audit's effects on 40 test problems (the 500-problem table is the slow
    test below): shifting the last value breaks the refinement, approving with the gold values
    fixes it, removing the supplied values gives back the attempt."""
    bench, actors = _shipped_base_actors()
    # registry/runs/synthetic-base.yaml's evaluation: greedy, 40 new tokens, 80 for the feedback
    sampling = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=40, feedback_max_new_tokens=80)
    res = probe_feedback(bench, actors, bench.load("test")[:40], sampling)
    acc = {row: r["acc@t2"] for row, r in res["rows"].items()}
    assert acc["last_shifted"] <= acc["own"] - 0.2
    assert acc["approve_gold"] >= acc["own"] + 0.4
    assert acc["oracle"] > acc["own"]
    assert abs(acc["values_removed"] - res["acc@t1"]) <= 0.05
    assert res["rows"]["last_shifted"]["copy_last_rate"] >= 0.9


#: The audit's table (issue 31: seed-10 shipped base, 500 test problems, greedy, only the feedback edited).
AUDIT = {"own": 0.370, "values_removed": 0.358, "last_shifted": 0.028, "approve_gold": 1.000, "approve_own": 0.358,
         "oracle": 0.754}


def _cli_probe(tmp_path, *flags):
    """``mlmt-bench probe feedback registry/runs/synthetic-base.yaml`` (500 test problems, greedy) in a
    child process, under the CPU pin the command applies, as measured."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "probe"
    subprocess.run([sys.executable, "-m", "mlmt_bench.cli", "-q", "probe", "feedback",
                    str(repo / "registry" / "runs" / "synthetic-base.yaml"), "--out", str(out), *flags],
                   check=True, cwd=repo)
    return json.loads((out / "probe.json").read_text())


@pytest.mark.slow
def test_the_shipped_base_reproduces_the_audits_table(tmp_path):
    """Measured 2026-12-04 on an AMD EPYC (the audit ran on an Intel Xeon): every row equal to the
    audit's, copy_last 99.4% after the critic's own feedback (the audit: 99.4%)."""
    res = _cli_probe(tmp_path, "--no-redact")
    got = {row: res["rows"][row]["acc@t2"] for row in AUDIT}
    assert all(abs(got[row] - want) <= 0.02 for row, want in AUDIT.items()), got
    assert res["acc@t1"] == pytest.approx(0.358, abs=0.02)


@pytest.mark.slow
def test_redaction_stops_the_shifted_and_the_gold_value_moving_the_refinement(tmp_path):
    """Issue 31's criterion on the shipped seed-10 base (500 test problems, greedy). Measured
    2026-12-07 on an AMD EPYC: own, last_shifted and approve_gold all 35.8% (= acc@t1). The
    numeric rule of other benchmarks did not meet it here (own 36.0%, last_shifted 4.8%,
    approve_gold 49.2%): a shifted or gold value that occurs anywhere in x or z was kept and
    copied; synthetic-arith's rule shows a check's numbers only as the attempt's own at that place."""
    red = _cli_probe(tmp_path, "--redact")
    own = red["rows"]["own"]["acc@t2"]
    assert abs(red["rows"]["last_shifted"]["acc@t2"] - own) <= 0.02
    assert abs(red["rows"]["approve_gold"]["acc@t2"] - own) <= 0.02
