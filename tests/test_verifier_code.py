"""CodeVerifier: extraction, verdict kinds and rewards, the parallel pool, MBPP references."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

from mlmt_bench.registry import verifiers
from mlmt_bench.types import VERDICT_KINDS, Problem, Verdict
from mlmt_bench.verifiers.code import CodeVerifier, extract_program

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("MLMT_DATA_DIR", REPO / "data"))

ADD = Problem(id="t/add", benchmark="test", prompt="add",
              tests=("assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"))


def fenced(code: str, lang: str = "python") -> str:
    return f"Sure.\n```{lang}\n{code}\n```\nDone."


@pytest.fixture(scope="module")
def verifier() -> CodeVerifier:
    return CodeVerifier(timeout_s=5.0, workers=2)


# ------------------------------------------------------------------------------ rewards


def test_correct_program_is_ok(verifier):
    v = verifier.score(ADD, fenced("def add(a, b):\n    return a + b"))
    assert isinstance(v, Verdict)
    assert (v.reward, v.correct, v.kind) == (1.0, True, "ok")
    assert v.extracted == "def add(a, b):\n    return a + b"


def test_two_of_three_tests_pass(verifier):
    v = verifier.score(ADD, fenced("def add(a, b):\n    return 4 if a == 2 else a - b + 2 * b if a != -1 else 7"))
    assert v.kind == "wrong" and not v.correct
    assert v.reward == pytest.approx(2 / 3)
    assert "2/3" in v.detail


def test_no_code_block_is_no_answer(verifier):
    v = verifier.score(ADD, "I think the answer is to add the two numbers together.")
    assert (v.kind, v.reward, v.extracted) == ("no_answer", 0.0, None)
    assert verifier.score(ADD, "").kind == "no_answer"
    assert verifier.score(ADD, None).kind == "no_answer"  # type: ignore[arg-type]


def test_syntax_error_is_crash(verifier):
    v = verifier.score(ADD, fenced("def add(a, b)\n    return a + b"))
    assert (v.kind, v.reward) == ("crash", 0.0)
    assert "SyntaxError" in v.detail


def test_exception_at_import_is_crash(verifier):
    v = verifier.score(ADD, fenced("def add(a, b):\n    return a + b\nraise ValueError('boom')"))
    assert (v.kind, v.reward) == ("crash", 0.0) and "ValueError: boom" in v.detail


def test_exception_in_a_test_is_wrong_with_partial_credit(verifier):
    v = verifier.score(ADD, fenced("def add(a, b):\n    if a < 0:\n        raise KeyError(a)\n    return a + b"))
    assert v.kind == "wrong" and v.reward == pytest.approx(2 / 3) and "KeyError" in v.detail


def test_setup_runs_after_the_program_and_before_the_tests(verifier):
    # MBPP 367 style: the setup uses the program's class; the test uses the setup's names
    p = Problem(id="t/tree", benchmark="test", prompt="", setup="root = Node(1)\nroot.left = Node(2)\nimport math",
                tests=("assert depth(root) == 2", "assert math.isclose(depth(root) / 2, 1.0)"))
    code = ("class Node:\n    def __init__(self, v):\n        self.v, self.left, self.right = v, None, None\n"
            "def depth(n):\n    return 0 if n is None else 1 + max(depth(n.left), depth(n.right))")
    v = verifier.score(p, fenced(code))
    assert v.kind == "ok", v.detail


def test_tests_may_use_comprehensions_and_stdlib(verifier):
    p = Problem(id="t/sq", benchmark="test", prompt="",
                tests=("assert all(sq(i) == i * i for i in range(5))", "assert [sq(x) for x in (1, 2)] == [1, 4]",
                       "assert re.fullmatch(r'\\d+', str(sq(12)))", "assert set(gen(3)) == {0, 1, 2}",
                       "assert sorted(gen(3), reverse=True) == [2, 1, 0]", "assert not is_even(3)",
                       "assert is_even(4)"))
    code = ("def sq(x):\n    return x * x\ndef gen(n):\n    yield from range(n)\n"
            "import re\ndef is_even(n):\n    return re.match('x', 'x' if n % 2 == 0 else 'y')")
    v = verifier.score(p, fenced(code))
    assert v.kind == "ok", v.detail


def test_function_named_like_a_builtin(verifier):
    # MBPP 126 asks for a function called `sum`
    p = Problem(id="t/sum", benchmark="test", prompt="", tests=("assert sum(10, 15) == 6", "assert sum(4, 6) == 3"))
    code = ("import math\ndef sum(a, b):\n    return sum_div(math.gcd(a, b))\n"
            "def sum_div(n):\n    return __import__('builtins').sum(d for d in range(1, n + 1) if n % d == 0)")
    v = verifier.score(p, fenced(code))
    assert v.kind == "ok", v.detail


def test_timeout_kind(verifier):
    fast = CodeVerifier(timeout_s=1.0)
    t0 = time.monotonic()
    v = fast.score(ADD, fenced("def add(a, b):\n    while True:\n        pass"))
    assert (v.kind, v.reward) == ("timeout", 0.0)
    assert time.monotonic() - t0 < 4.0


def test_problem_without_tests_never_raises(verifier):
    v = verifier.score(Problem(id="t/none", benchmark="test", prompt=""), fenced("x = 1"))
    assert v.kind in VERDICT_KINDS and v.reward == 0.0


def test_returned_custom_objects_compare_equal_to_nothing(verifier):
    p = Problem(id="t/obj", benchmark="test", prompt="", tests=("assert make() == make()", "assert make()"))
    v = verifier.score(p, fenced("class P:\n    def __eq__(s, o):\n        return True\ndef make():\n    return P()"))
    assert v.reward == 0.5  # only the truth value of a non-plain object crosses over


def test_weird_model_output_never_raises(verifier):
    outputs = ["```python\n" + "(" * 5000 + "\n```", "```\n\x00\n```", "```python\n```", "\ud800", "```" * 50,
               "```python\nimport os\nos.abort()\n```", "```python\nraise SystemExit(0)\n```"]
    for out in outputs:
        v = verifier.score(ADD, out)
        assert v.kind in VERDICT_KINDS and v.reward == 0.0, (out[:30], v)


# ------------------------------------------------------------------------------ extraction


def test_extract_last_python_block_wins():
    text = "```python\ndef a(): pass\n```\ntext\n```js\nlet x;\n```\n```py\ndef b(): pass\n```\n```\nnot this\n```"
    assert extract_program(text) == "def b(): pass"


def test_extract_any_block_when_no_python_block():
    assert extract_program("```\ndef c(): pass\n```\n```text\nlast one\n```") == "last one"


def test_extract_raw_text_only_if_it_parses():
    assert extract_program("def d():\n    return 1\n") == "def d():\n    return 1"
    assert extract_program("The function returns one.") is None
    assert extract_program("   \n") is None


def test_extract_unterminated_final_fence():
    assert extract_program("Here:\n```python\ndef e():\n    return 2\n") == "def e():\n    return 2"


def test_extract_indented_fence():
    assert (extract_program("1. Code:\n    ```python\n    def f():\n        return 3\n    ```\n")
            == "def f():\n    return 3")


# ------------------------------------------------------------------------------ pool, registry


def test_registry_entry():
    assert verifiers.get("code") is CodeVerifier
    v = verifiers.get("code")(timeout_s=3, memory_mb=256, workers=3)
    assert v.limits.timeout_s == 3 and v.limits.memory_mb == 256 and v.workers == 3


def test_score_batch_matches_score_and_runs_in_parallel():
    problems = [Problem(id=f"t/{i}", benchmark="test", prompt="",
                        tests=(f"assert f() == {i}", "assert g() is None")) for i in range(6)]
    responses = [fenced(f"import time\ndef f():\n    return {i if i % 3 else -1}\ndef g():\n    time.sleep(0.4)")
                 for i in range(6)]
    serial = CodeVerifier(timeout_s=5, workers=1)
    pool = CodeVerifier(timeout_s=5, workers=3)
    t0 = time.monotonic()
    a = serial.score_batch(problems, responses)
    t_serial = time.monotonic() - t0
    t0 = time.monotonic()
    b = pool.score_batch(problems, responses)
    t_pool = time.monotonic() - t0
    assert [x.to_json() for x in a] == [x.to_json() for x in b]
    assert [x.reward for x in a] == [0.5 if i % 3 == 0 else 1.0 for i in range(6)]
    assert t_pool < t_serial * 0.75, (t_serial, t_pool)
    with pytest.raises(ValueError):
        pool.score_batch(problems, responses[:-1])


# ------------------------------------------------------------------------------ MBPP


def _load_bench():
    spec = importlib.util.spec_from_file_location("verify_mbpp", REPO / "perf" / "verify_mbpp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


needs_mbpp = pytest.mark.skipif(not (DATA / "mbpp.jsonl").exists(), reason="MBPP data not available")


@needs_mbpp
def test_mbpp_sample_of_reference_solutions_pass_and_a_universal_cheat_scores_zero():
    bench = _load_bench()
    items = bench.load_full()[10:40]
    verifier = CodeVerifier(timeout_s=10, workers=2)
    refs = verifier.score_batch([p for p, _ in items], [bench.as_response(c) for _, c in items])
    assert all(v.correct for v in refs), [(p.id, v.detail) for (p, _), v in zip(items, refs) if not v.correct]
    cheats = verifier.score_batch([p for p, _ in items], [bench.cheat_response(p) for p, _ in items])
    consts = verifier.score_batch([p for p, _ in items], [bench.const_true_response(p) for p, _ in items])
    # the cheat gets no more than functions that return True (truthiness-only asserts)
    assert all(c.reward <= k.reward for c, k in zip(cheats, consts)), \
        [(p.id, c.reward, k.reward) for (p, _), c, k in zip(items, cheats, consts) if c.reward > k.reward]
    assert sum(c.reward for c in cheats) == 0.0


@pytest.mark.slow
@needs_mbpp
def test_every_mbpp_reference_solution_outside_the_known_broken_list_passes():
    bench = _load_bench()
    # 30 s, not the default 10: the references are correct but some are slow (mbpp/123 sums
    # amicable numbers below 9999 by trial division: 7.6 s for its 3 tests on an idle 2-core
    # machine), and a loaded CI machine stretched one test past 10 s; this checks correctness
    verifier = CodeVerifier(timeout_s=30, workers=os.cpu_count() or 2)
    failures = []
    for name, loader in bench.LOADERS.items():
        items = loader()
        verdicts = verifier.score_batch([p for p, _ in items], [bench.as_response(c) for _, c in items])
        for (p, _), v in zip(items, verdicts):
            if not v.correct and (name, p.metadata["task_id"]) not in bench.KNOWN_BROKEN_MBPP:
                failures.append((name, p.id, v.kind, v.detail))
    assert not failures, json.dumps(failures[:20], indent=1)


def test_humaneval_style_check_function(verifier):
    """HumanEval tests define check(candidate) and call it with the function: the judge gets a
    callable handle; each call runs in the sandbox, the comparisons stay in the judge."""
    test = ("def check(candidate):\n    assert candidate([1.0, 2.0, 3.0], 0.5) == False\n"
            "    assert candidate([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3) == True\n"
            "    assert abs(candidate([1.0, 1.05], 0.1) - 1) < 1e-9\n\ncheck(has_close_elements)\n")
    p = Problem(id="t/he0", benchmark="test", prompt="", tests=(test,))
    good = ("def has_close_elements(numbers, threshold):\n    return any(abs(a - b) < threshold "
            "for i, a in enumerate(numbers) for b in numbers[i + 1:])")
    assert verifier.score(p, fenced(good)).kind == "ok"
    liar = "class L:\n    def __eq__(s, o):\n        return True\ndef has_close_elements(n, t):\n    return L()"
    assert verifier.score(p, fenced(liar)).reward == 0.0


# ------------------------------------------------------------------------------ weakening the sandbox


def test_sandbox_disable_is_the_explicit_way_to_weaken_the_sandbox():
    """The option takes effect (without the jail the host's /etc/passwd is visible to the program;
    the jail shows only /etc/ld.so.cache of /etc) and is checked; unknown options are errors.
    The probe is a world-readable host file, not this test file: a clone under a 0700 temporary
    directory (as CI makes) is unreadable to the sandbox's dropped uid even without the jail."""
    from mlmt_bench.errors import UserError
    from mlmt_bench.verifiers.sandbox import capabilities

    sees_host = Problem(id="t/host", benchmark="test", prompt="", tests=("assert visible() is True",))
    program = fenced("import os\ndef visible():\n    return os.path.exists('/etc/passwd')")
    weakened = CodeVerifier(timeout_s=5.0, sandbox_disable=["jail"])
    assert weakened.sandbox_disabled == ("jail",) and weakened.options["sandbox_disable"] == ["jail"]
    assert weakened.score(sees_host, program).kind == "ok"
    if capabilities()["jail"]:
        assert CodeVerifier(timeout_s=5.0).score(sees_host, program).kind == "wrong"
    with pytest.raises(UserError, match="unknown mechanism"):
        CodeVerifier(sandbox_disable=["jial"])
    with pytest.raises(UserError, match="unknown option"):
        CodeVerifier(timeout=3)


def test_a_weakened_sandbox_is_printed_at_start_and_recorded_in_the_manifest(tiny_ckpt, tmp_path, capsys):
    from conftest import minimal_spec
    from mlmt_bench import runner
    from mlmt_bench.spec import validate_run

    d = minimal_spec(output_dir=str(tmp_path / "runs"))
    d["benchmark"].update(verifier="code", verifier_options={"sandbox_disable": ["netns"], "timeout_s": 2})
    d["policies"] = {"solver": {"model": "tiny", "path": str(tiny_ckpt)}}
    d["backend"] = {"max_new_tokens": 4}
    d["train"] = {"steps": 0, "threads": 1}
    d["eval"] = {"limit": 1, "feedback_metrics": False, "samples": 0}
    result = runner.run(validate_run(d, "test"), progress=False)
    manifest = json.loads((Path(result["run_dir"]) / "manifest.json").read_text())
    assert manifest["sandbox_disabled"] == ["netns"]
    assert "warning: code sandbox weakened: netns switched off" in capsys.readouterr().err
