"""Environment variables set for the length of a ``with`` block."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def temporary_environ(**values: str) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` inside the block, then restore each variable as it was
    (removed if it was unset), whatever the block raised."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
