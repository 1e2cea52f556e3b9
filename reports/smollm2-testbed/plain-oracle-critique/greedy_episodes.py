"""Print the warm-started solver's greedy attempts at the first N validation problems, each
with the critic's greedy critique (to read what the critic says, right or wrong).

Usage: python greedy_episodes.py [SPEC] [N]   (SPEC must name a critic policy; N defaults to 40)
"""

import sys

from mlmt_bench import runner
from mlmt_bench.rollout.episodes import Actors, Program, Sampling, critique, rollout
from mlmt_bench.spec import load_run_spec


def main(spec_path: str, n: int) -> None:
    spec = load_run_spec(spec_path)
    runner.configure_torch(spec)
    comp = runner.build(spec, progress=False, gate=False)
    problems = comp.benchmark.load("validation")[:n]
    greedy = Sampling(
        temperature=0.0,
        top_p=1.0,
        max_new_tokens=128,
        feedback_max_new_tokens=128,
        feedback_temperature=0.0,
    )
    with runner.cpu_autocast(spec):
        actors = Actors(
            comp.policies["solver"],
            None,
            comp.backend,
            comp.templates,
            comp.verifier,
            None,
            comp.benchmark.feedback_verdict,
        )
        attempts = rollout(Program(attempts=1), actors, problems, greedy).turns
        texts = [a.text for a in attempts]
        critiques = critique(comp.policies["critic"], comp.backend, comp.templates, problems, texts, greedy)
    for problem, attempt, feedback in zip(problems, attempts, critiques, strict=True):
        verdict = "RIGHT" if attempt.verdict.correct else "WRONG"
        print("=====", problem.prompt, "gold", problem.answer, verdict)
        print(attempt.text)
        print("--")
        print(feedback)


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "registry/runs/smollm2-testbed-mlmt.yaml",
        int(sys.argv[2]) if len(sys.argv) > 2 else 40,
    )
