"""Test helpers importable from subprocesses (PYTHONPATH=tests)."""

from mlmt_bench.types import Verdict
from mlmt_bench.verifiers.base import Verifier


class ParityVerifier(Verifier):
    """Reward 1 for an even number of generated characters: a non-degenerate, deterministic
    signal that even an untrained tiny model gets right half of the time."""

    def score(self, problem, response):
        ok = len(response) % 2 == 0
        return Verdict(float(ok), ok, response, "ok" if ok else "wrong")
