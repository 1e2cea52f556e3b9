"""What a report counts as a number in a log record."""

from __future__ import annotations

import math
from typing import Any, TypeGuard


def is_num(v: Any) -> TypeGuard[float]:  # float: an int too, to the type checker
    """A finite int or float (not a bool, nor an integer too large for a float: 10**400)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False
