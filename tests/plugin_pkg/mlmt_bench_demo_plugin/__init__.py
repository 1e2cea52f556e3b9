"""A third-party plugin: registers a benchmark, a verifier with its own leak check, an algorithm
and a generation backend through the entry point, touching nothing in mlmt_bench.

- ``demo-echo``: the answer to prompt "2" is "2"; it has an oracle critic, whose feedback spells
  the answer out ("the answer is two");
- ``demo-exact``: exact string match; a feedback leaks when it spells the gold number out (which
  the built-in rules, looking for the digits, would not see);
- ``demo-refine`` (algorithm.py): attempts, oracle feedback, refinements;
- ``demo-loop`` (backend.py): token-by-token generation with the training model.
"""

from mlmt_bench.benchmarks.base import OracleBenchmark
from mlmt_bench.types import Problem, Verdict
from mlmt_bench.verifiers.base import Verifier

WORDS = ("zero", "one", "two", "three")


class EchoBenchmark(OracleBenchmark):
    name = "demo-echo"
    default_verifier = "demo-exact"

    def load(self, split):
        self.check_split(split)
        return [Problem(id=f"{split}/{i}", benchmark=self.name, prompt=str(i), answer=str(i)) for i in range(4)]

    def solution(self, problem):
        return problem.answer

    def oracle_feedback(self, problem, attempt):
        return f"the answer is {WORDS[int(problem.answer)]}"

    def inject_errors(self, solution, rng, second_error_rate=0.15):
        return str(int(solution) + 1)

    def apply_feedback(self, problem, attempt, feedback, *, revision=False, **options):
        return problem.answer


class ExactVerifier(Verifier):
    name = "demo-exact"

    def score(self, problem, response):
        ok = response.strip() == problem.answer
        return Verdict(float(ok), ok, response.strip(), "ok" if ok else "wrong")

    def leaks(self, feedback, gold):
        """Whether the feedback spells the gold number out as a word ("two" for "2")."""
        if gold is None:
            return None
        return WORDS[int(gold)] in feedback.lower().split()


def register(registries):
    registries["benchmark"].register("demo-echo", EchoBenchmark, "echo the number back (plugin demo)")
    registries["verifier"].register("demo-exact", "mlmt_bench_demo_plugin:ExactVerifier",
                                    "exact string match (plugin demo)")
    registries["algorithm"].register("demo-refine", "mlmt_bench_demo_plugin.algorithm:OracleRefine",
                                     "attempt, oracle feedback, refinement (plugin demo)")
    registries["backend"].register("demo-loop", "mlmt_bench_demo_plugin.backend:LoopBackend",
                                   "token-by-token generation without a cache (plugin demo)")
