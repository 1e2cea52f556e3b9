"""Benchmark of the code verifier on MBPP's own reference solutions.

Runs every reference solution of MBPP full (974 tasks, ``test_setup_code`` + ``test_list``) and
MBPP sanitized (427 tasks, ``test_imports`` + ``test_list``) through
:class:`mlmt_bench.verifiers.code.CodeVerifier`, once serially (``workers=1``) and once with the
parallel pool, and prints passes/total per set, the failing task ids with the reason, the wall
times and the serial/parallel ratio. Reads the data files directly (json), not through the
benchmark loader.

    python perf/verify_mbpp.py [--workers 2] [--limit N] [--sets full,sanitized]
                                     [--timeout 10] [--no-serial] [--json out.json]

Exit status 1 if a reference solution outside ``KNOWN_BROKEN_MBPP`` fails, or if a listed one
now passes (the list is then stale).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from mlmt_bench.types import Problem
from mlmt_bench.verifiers.code import CodeVerifier

DATA_DIR = Path(os.environ.get("MLMT_DATA_DIR", Path(__file__).resolve().parents[1] / "data"))

# Reference solutions that fail their own tests upstream, keyed by (set, task_id), with a
# one-line reason each. It is empty, and that was checked rather than assumed: with these data
# files (see data/SOURCES.md) every reference solution of both sets passes all of
# its tests through this verifier (974/974 full, 427/427 sanitized), and also under a plain
# `exec(code + "\n" + setup + "\n" + tests)` in a fresh CPython 3.11.7 with PYTHONHASHSEED
# 0..7 (no hash-order dependence), and the 11 full-set `challenge_test_list`s pass too. MBPP's
# known defects are elsewhere (task 118's junk prompt text, prompts that do not name the function
# the tests call), which a reference-solution run cannot see. Add an entry only for a failure
# that reproduces under a plain exec; a failure that only this verifier shows is a bug here.
KNOWN_BROKEN_MBPP: dict[tuple[str, int], str] = {}


def load_full(path: Path | None = None) -> list[tuple[Problem, str]]:
    path = path or DATA_DIR / "mbpp.jsonl"
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            r = json.loads(line)
            p = Problem(id=f"mbpp/{r['task_id']}", benchmark="mbpp", prompt=r["text"],
                        tests=tuple(r["test_list"]), setup=r.get("test_setup_code") or "",
                        metadata={"task_id": r["task_id"]})
            out.append((p, r["code"]))
    return out


def load_sanitized(path: Path | None = None) -> list[tuple[Problem, str]]:
    path = path or DATA_DIR / "sanitized-mbpp.json"
    with open(path, encoding="utf-8") as fh:
        rows = json.load(fh)
    out = []
    for r in rows:
        p = Problem(id=f"mbpp-sanitized/{r['task_id']}", benchmark="mbpp-sanitized", prompt=r["prompt"],
                    tests=tuple(r["test_list"]), setup="\n".join(r.get("test_imports") or []),
                    metadata={"task_id": r["task_id"]})
        out.append((p, r["code"]))
    return out


LOADERS = {"full": load_full, "sanitized": load_sanitized}


def as_response(code: str) -> str:
    """A model-like response around the reference code (exercises the extraction too)."""
    return "Here is my solution.\n\n```python\n" + code.replace("\r\n", "\n") + "\n```\n"


_CHEAT_PRELUDE = """
import builtins, math, sys

class _Liar:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    __le__ = __gt__ = __ge__ = __lt__
    def __bool__(self): return True
    def __len__(self): return 0
    def __iter__(self): return iter(())
    def __contains__(self, item): return True
    def __getattr__(self, name): return self
    def __getitem__(self, key): return self
    def __call__(self, *args, **kwargs): return self
    def __float__(self): return 0.0
    def __int__(self): return 0
    def __index__(self): return 0
    def __hash__(self): return 0
    def __round__(self, n=None): return self
    def __abs__(self): return self
    def __add__(self, other): return self
    __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __mod__ = __add__

class _NoAssert(Exception):
    pass

builtins.AssertionError = _NoAssert
math.isclose = lambda *a, **k: True
"""


def _test_names(problem: Problem) -> list[str]:
    import ast
    import builtins

    names: set[str] = set()
    for src in (*problem.tests, problem.setup):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    own = {n for n in names if not hasattr(builtins, n) and n not in sys.stdlib_module_names}
    return sorted(own or {n for n in names if hasattr(builtins, n) and n[0].islower()})


def cheat_response(problem: Problem) -> str:
    """A "universal cheat": every name the tests use returns an object equal to everything,
    truthy, with AssertionError and math.isclose monkeypatched. Against a naive
    exec(program + tests) verifier it passes every test."""
    body = _CHEAT_PRELUDE + "".join(f"\ndef {n}(*args, **kwargs):\n    return _Liar()\n" for n in _test_names(problem))
    return "```python\n" + body + "```"


def const_true_response(problem: Problem) -> str:
    """Control for the cheat: every name returns True (what an honest constant can get)."""
    body = "".join(f"def {n}(*args, **kwargs):\n    return True\n" for n in _test_names(problem))
    return "```python\n" + body + "```"


def run_set(items, workers: int, timeout_s: float, make_response=None):
    verifier = CodeVerifier(timeout_s=timeout_s, workers=workers)
    problems = [p for p, _ in items]
    make_response = make_response or (lambda p, c: as_response(c))
    responses = [make_response(p, c) for p, c in items]
    t0 = time.perf_counter()
    verdicts = verifier.score_batch(problems, responses)
    return verdicts, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="parallel pool size (default 2)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N tasks of each set")
    ap.add_argument("--sets", default="full,sanitized")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--no-serial", action="store_true", help="skip the serial pass")
    ap.add_argument("--json", help="write per-task verdicts here")
    ap.add_argument("--no-cheat", action="store_true", help="skip the universal-cheat control")
    args = ap.parse_args(argv)

    from mlmt_bench.verifiers.sandbox import capabilities

    caps = capabilities()
    isolation = ", ".join(m for m in ("uid_drop", "pidns", "netns", "jail", "cgroup") if caps.get(m))
    print("isolation:", isolation or "basic", f"(cpus={os.cpu_count()})")
    status = 0
    dump = {}
    totals = {"serial": 0.0, "parallel": 0.0}
    for name in [s.strip() for s in args.sets.split(",") if s.strip()]:
        items = LOADERS[name]()
        if args.limit:
            items = items[: args.limit]
        runs = {}
        if not args.no_serial:
            runs["serial"] = run_set(items, 1, args.timeout)
        runs["parallel"] = run_set(items, args.workers, args.timeout)
        print(f"\n== MBPP {name}: {len(items)} reference solutions")
        for mode, (verdicts, wall) in runs.items():
            totals[mode] += wall
            passes = sum(v.correct for v in verdicts)
            label = "serial (workers=1)" if mode == "serial" else f"parallel (workers={args.workers})"
            print(f"  {label:24s} {passes}/{len(items)} pass   {wall:7.1f} s   "
                  f"{1000 * wall / max(1, len(items)):6.1f} ms/task")
        verdicts = runs["parallel"][0]
        if "serial" in runs:
            s_wall, p_wall = runs["serial"][1], runs["parallel"][1]
            print(f"  serial/parallel ratio    {s_wall / p_wall:.2f}x")
            diff = [p.id for (p, _), a, b in zip(items, runs["serial"][0], verdicts)
                    if (a.kind, a.reward) != (b.kind, b.reward)]
            if diff:
                print(f"  !! serial and parallel verdicts differ on {len(diff)} tasks: {diff[:20]}")
                status = 1
        failing = [(p, v) for (p, _), v in zip(items, verdicts) if not v.correct]
        print(f"  failing ({len(failing)}):")
        for p, v in failing:
            key = (name, p.metadata["task_id"])
            note = f"  [known: {KNOWN_BROKEN_MBPP[key]}]" if key in KNOWN_BROKEN_MBPP else "  [UNEXPECTED]"
            print(f"    {p.metadata['task_id']:>4}  {v.kind:17s} {v.detail[:150]}{note}")
            if key not in KNOWN_BROKEN_MBPP:
                status = 1
        failing_ids = {p.metadata["task_id"] for p, _ in failing}
        stale = [tid for (s, tid) in KNOWN_BROKEN_MBPP if s == name and tid not in failing_ids
                 and any(p.metadata["task_id"] == tid for p, _ in items)]
        if stale:
            print(f"  !! listed as broken but passing now: {stale}")
            status = 1
        dump[name] = {p.id: v.to_json() for (p, _), v in zip(items, verdicts)}
        if not args.no_cheat:
            cheat, c_wall = run_set(items, args.workers, args.timeout, lambda p, c: cheat_response(p))
            const, _ = run_set(items, args.workers, args.timeout, lambda p, c: const_true_response(p))
            got = [(p, a, b) for (p, _), a, b in zip(items, cheat, const) if a.reward > 0]
            cheat_mean, const_mean = (sum(v.reward for v in vs) / len(items) for vs in (cheat, const))
            print(f"  universal cheat (naive verifiers: 100%): mean reward {cheat_mean:.4f},"
                  f" {sum(v.correct for v in cheat)} tasks fully passed, {len(got)} with reward > 0  ({c_wall:.1f} s)")
            print(f"  constant-True control:                   mean reward {const_mean:.4f},"
                  f" {sum(v.correct for v in const)} tasks fully passed")
            better = [(p.metadata["task_id"], a.reward, b.reward) for p, a, b in got if a.reward > b.reward]
            if better:
                print(f"  cheat beats constant True on (task, cheat, const): {better}")
    if totals["serial"]:
        print(f"\nall sets: serial {totals['serial']:.1f} s, parallel {totals['parallel']:.1f} s, "
              f"ratio {totals['serial'] / totals['parallel']:.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dump, fh, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
