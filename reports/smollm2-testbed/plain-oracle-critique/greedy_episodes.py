import torch
from mlmt_bench.spec import load_run_spec
from mlmt_bench import runner
from mlmt_bench.rollout.episodes import Actors, Program, Sampling, critique, rollout
import sys
spec = load_run_spec(sys.argv[1] if len(sys.argv) > 1 else "registry/runs/smollm2-testbed.yaml")
runner.configure_torch(spec)
comp = runner.build(spec, progress=False, gate=False)
probs = comp.benchmark.load("validation")[:int(sys.argv[2]) if len(sys.argv) > 2 else 40]
s = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=128, feedback_max_new_tokens=128, feedback_temperature=0.0)
with runner.cpu_autocast(spec):
    actors = Actors(comp.policies["solver"], None, comp.backend, comp.templates, comp.verifier, None, comp.benchmark.feedback_verdict)
    att = rollout(Program(attempts=1), actors, probs, s).turns
    fb = critique(comp.policies["critic"], comp.backend, comp.templates, probs, [a.text for a in att], s)
for p, a, f in zip(probs, att, fb):
    ok = a.verdict.correct
    print("=====", p.prompt, "gold", p.answer, "RIGHT" if ok else "WRONG")
    print(a.text); print("--"); print(f)
