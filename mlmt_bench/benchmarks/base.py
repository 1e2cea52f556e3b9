"""The interface every benchmark implements."""

from __future__ import annotations

from typing import Any, ClassVar

from mlmt_bench.errors import UserError
from mlmt_bench.types import Problem, PromptTemplates


class Benchmark:
    """A source of problems.

    Construct with the spec's ``benchmark`` options: ``Benchmark(path=None, seed=0, **options)``.
    ``load(split)`` returns the problems of a split in a deterministic order for the seed.
    """

    name: ClassVar[str] = ""
    default_verifier: ClassVar[str] = ""
    splits: ClassVar[tuple[str, ...]] = ("train", "validation", "test")
    templates: ClassVar[PromptTemplates] = PromptTemplates()

    def __init__(self, path: str | None = None, seed: int = 0, **options: Any) -> None:
        self.path = path
        self.seed = seed
        if options:
            raise UserError(f"benchmark {self.name}: unknown option(s) {', '.join(sorted(options))}")

    def load(self, split: str) -> list[Problem]:
        raise NotImplementedError

    def check_split(self, split: str) -> None:
        if split not in self.splits:
            raise UserError(f"benchmark {self.name}: unknown split {split!r} (known: {', '.join(self.splits)})")
