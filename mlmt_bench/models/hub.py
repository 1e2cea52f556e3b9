"""Where a model ``path`` points, decided before anything loads: a local directory, or a hub
name (``org/name``), which loads from the hub or from its local cache.

A path that looks local (absolute, ``./``, ``../``, ``~``, or a relative path whose first folder
exists here) and does not exist is refused in one line, by ``validate`` as by ``run``: it was
read as a hub name and failed only at load time. A hub name that is not in the local cache
fails fast when the hub cannot answer (``HF_HUB_OFFLINE=1``, or no answer within
:data:`PROBE_TIMEOUT_S`), instead of after a minute of the hub client's retries; one that is
cached then loads from the cache alone.
"""

from __future__ import annotations

import os
from pathlib import Path

#: how long the one probe of the hub may take (seconds)
PROBE_TIMEOUT_S = 3.0
_reachable: dict[str, bool] = {}  # endpoint -> answer of its one probe in this process


def looks_local(path: str) -> bool:
    """Whether ``path`` names a local directory rather than a hub repository: absolute, starting
    with ``./``, ``../`` or ``~``, or relative with a first folder that exists here."""
    p = path.strip()
    if p in (".", "..") or p.startswith(("/", "./", "../", "~")) or os.path.isabs(p):
        return True
    parts = Path(p).parts
    return len(parts) > 1 and Path(parts[0]).is_dir()


def missing_local(path: str) -> str | None:
    """What is wrong with a local-looking ``path`` that does not exist (one phrase), else None
    (it exists, or it is a hub name)."""
    if not looks_local(path) or Path(path).expanduser().exists():
        return None
    return "no such local directory"


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` is set (the hub client's own switch: 1, true, yes, on)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def in_hub_cache(name: str) -> bool:
    """Whether the hub repository ``name`` has a config.json in the local hub cache."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except (ValueError, OSError):  # not a valid repository id
        return False


def hub_reachable(timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the hub's endpoint answers an HTTP request within ``timeout_s`` (any status counts);
    asked once per process. False under ``HF_HUB_OFFLINE``."""
    if hub_offline():
        return False
    from huggingface_hub import constants

    endpoint = constants.ENDPOINT
    if endpoint not in _reachable:
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
            _reachable[endpoint] = True
        except urllib.error.HTTPError:  # an answer, even an error status: the hub is there
            _reachable[endpoint] = True
        except (OSError, ValueError):  # no route, no name resolution, a timeout
            _reachable[endpoint] = False
    return _reachable[endpoint]


def hub_load_from_cache(name: str) -> bool:
    """How to load the hub repository ``name``: False to ask the hub (it answers), True to read
    the local cache alone (the hub is offline or silent, and the cache has it). A UserError in
    one line when neither can give it."""
    from mlmt_bench.errors import UserError

    if not hub_offline() and hub_reachable():
        return False
    if in_hub_cache(name):
        return True
    why = "HF_HUB_OFFLINE is set" if hub_offline() else f"the hub did not answer within {PROBE_TIMEOUT_S:g} s"
    raise UserError(f"model {name!r}: not a local directory, not in the local hub cache, and {why}")
