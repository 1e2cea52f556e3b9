"""What the library tells the user besides errors and progress bars: a note or a warning, one
line on stderr each.

Library modules never write to ``sys.stderr`` themselves: they call :func:`note`, :func:`warn`
or :func:`tell`, which write to the stderr of the moment (the CLI's, a test's capture), with every
control character escaped (:func:`~mlmt_bench.io.bounded_input.printable`: a note may quote a path
or a name from a spec). One place decides how the user is told.
"""

from __future__ import annotations

import sys

from mlmt_bench.io.bounded_input import printable


def tell(line: str) -> None:
    """``line`` (a complete message, e.g. one that starts with ``warning:``) on stderr."""
    sys.stderr.write(printable(line) + "\n")
    sys.stderr.flush()


def note(text: str) -> None:
    """``note: text`` on stderr: something worth knowing that changes nothing."""
    tell(f"note: {text}")


def warn(text: str) -> None:
    """``warning: text`` on stderr: the run goes on, weaker or different than asked."""
    tell(f"warning: {text}")
