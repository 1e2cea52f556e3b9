"""A third-party plugin: registers one benchmark and one verifier through the entry point."""

from mlmt_bench.benchmarks.base import Benchmark
from mlmt_bench.types import Problem, Verdict
from mlmt_bench.verifiers.base import Verifier


class EchoBenchmark(Benchmark):
    name = "demo-echo"
    default_verifier = "demo-exact"

    def load(self, split):
        self.check_split(split)
        return [Problem(id=f"{split}/{i}", benchmark=self.name, prompt=str(i), answer=str(i)) for i in range(4)]


class ExactVerifier(Verifier):
    name = "demo-exact"

    def score(self, problem, response):
        ok = response.strip() == problem.answer
        return Verdict(float(ok), ok, response.strip(), "ok" if ok else "wrong")


def register(registries):
    registries["benchmark"].register("demo-echo", EchoBenchmark, "echo the number back (plugin demo)")
    registries["verifier"].register("demo-exact", "mlmt_bench_demo_plugin:ExactVerifier",
                                    "exact string match (plugin demo)")
