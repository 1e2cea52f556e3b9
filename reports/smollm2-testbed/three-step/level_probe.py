"""A warm start's solver acc@t1 on levels it was not built for, greedy and at T 1.0, on 96 validation
problems of each (how the testbed's level was chosen; output in level-probe.txt).

Usage: python level_probe.py SPEC LEVEL...   (LEVEL: three-step-products, two-step-mixed, two-step-products)
"""

import sys

import torch

from mlmt_bench import runner
from mlmt_bench.benchmarks.nl_arith import NLArith
from mlmt_bench.rollout.episodes import Actors, Program, Sampling, rollout
from mlmt_bench.spec import load_run_spec

LEVELS = {
    "three-step-products": {"ops": "*", "steps": 3},
    "two-step-mixed": {"ops": "*+-", "steps": 2},
    "two-step-products": {"ops": "*", "steps": 2},
}


def main(spec_path: str, levels: list[str]) -> None:
    spec = load_run_spec(spec_path)
    runner.configure_torch(spec)
    comp = runner.build(spec, progress=False, gate=False)
    for name in levels:
        bench = NLArith(digits=1, style="mixed", n_train=160, n_validation=96, n_test=240, **LEVELS[name])
        problems = bench.load("validation")
        for temperature in (0.0, 1.0):
            torch.manual_seed(0)
            sampling = Sampling(temperature=temperature, top_p=1.0, max_new_tokens=160,
                                feedback_max_new_tokens=128, feedback_temperature=0.0)
            with runner.cpu_autocast(spec):
                actors = Actors(comp.policies["solver"], None, comp.backend, comp.templates, comp.verifier, None,
                                bench.feedback_verdict)
                attempts = rollout(Program(attempts=1), actors, problems, sampling).turns
            right = sum(a.verdict.correct for a in attempts)
            print(name, "T", temperature, f"{right}/{len(attempts)} = {right / len(attempts):.1%}", flush=True)
            if temperature == 0.0:
                for problem, attempt in list(zip(problems, attempts, strict=True))[:3]:
                    print("   ", problem.prompt, "|", attempt.text.replace("\n", " / "), "| gold", problem.answer)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
