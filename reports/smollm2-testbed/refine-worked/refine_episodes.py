"""Print the warm-started solver's greedy attempts at the first N validation problems, each with
the oracle's worked feedback as the refiner reads it (redacted) and the solver's greedy
refinement after it; then acc@t1, acc@t2 and how many answers the refinement changed.

Usage: python refine_episodes.py [SPEC] [N]   (N defaults to 24)
"""

import sys

from mlmt_bench import runner
from mlmt_bench.rollout.episodes import Sampling, _generate, attempt_prompt, refine_prompt
from mlmt_bench.spec import load_run_spec


def main(spec_path: str, n: int) -> None:
    spec = load_run_spec(spec_path)
    runner.configure_torch(spec)
    comp = runner.build(spec, progress=False, gate=False)
    bench, solver, tpl = comp.benchmark, comp.policies["solver"], comp.templates
    problems = bench.load("validation")[:n]
    limit = spec.backend.max_new_tokens
    greedy = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=limit, feedback_max_new_tokens=limit,
                      feedback_temperature=0.0)
    with runner.cpu_autocast(spec):
        prompts = [attempt_prompt(solver.tokenizer, tpl, p) for p in problems]
        attempts = _generate(solver, prompts, greedy, limit, comp.backend)
        texts = [a.text for a in attempts]
        feedback = [bench.redact_feedback(p, z, bench.worked_feedback(p, z)).text for p, z in zip(problems, texts)]
        refine = [refine_prompt(solver.tokenizer, tpl, p, a, g.ids, z, f)
                  for p, a, g, z, f in zip(problems, prompts, attempts, texts, feedback)]
        refinements = _generate(solver, refine, greedy, limit, comp.backend)
    t1 = comp.verifier.score_batch(problems, texts)
    t2 = comp.verifier.score_batch(problems, [r.text for r in refinements])
    for p, z, f, r, a, b in zip(problems, texts, feedback, refinements, t1, t2):
        print("=====", p.prompt, "| gold", p.answer, "| t1", a.correct, "| t2", b.correct)
        print(z)
        print("-- the oracle's worked feedback, redacted:")
        print(f)
        print("-- refinement:")
        print(r.text)
    print(f"acc@t1 {sum(a.correct for a in t1)}/{n}, acc@t2 {sum(b.correct for b in t2)}/{n}; "
          f"wrong -> right {sum(b.correct and not a.correct for a, b in zip(t1, t2))}, "
          f"right -> wrong {sum(a.correct and not b.correct for a, b in zip(t1, t2))}, "
          f"answer changed {sum(a.extracted != b.extracted for a, b in zip(t1, t2))}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "registry/runs/smollm2-testbed-mlmt.yaml",
         int(sys.argv[2]) if len(sys.argv) > 2 else 24)
