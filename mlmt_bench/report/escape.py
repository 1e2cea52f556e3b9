"""Text from runs (model outputs, arm names, a published report's data) as the report's pages
show it: every character that is neither printable nor a line break or tab written as an escape
(``\\x1b``, ``\\u202e``, ``\\x9b``, ``\\ud800``: C0 / C1 controls, bidi overrides, lone
surrogates of broken output), as :func:`mlmt_bench.io.bounded_input.printable` writes them in
messages and comparison.md; then HTML-escaped. A page never holds a raw escape sequence, a bidi
override that reorders what it shows, or a surrogate that breaks its encoding.
"""

from __future__ import annotations

import html
from typing import Any

from mlmt_bench.io.bounded_input import escape_unprintable

#: kept as they are: a model's output has lines and, in code, tabs
_KEPT = "\t\n\r"


def shown(text: str) -> str:
    """``text`` with every character that is not printable (bar line breaks and tabs) escaped."""
    return escape_unprintable(text, keep=_KEPT)


def esc(value: Any) -> str:
    """``str(value)`` as text safe inside HTML elements and quoted attributes (:func:`shown`, then escaped)."""
    return html.escape(shown(str(value)), quote=True)
