"""Reading numeric settings from the environment, with clear errors."""

from __future__ import annotations

import os

from .errors import MPIKVStoreError


def env_number(name: str, default: float, kind: type = float) -> float:
    """$name as a non-negative `kind` (int or float), else `default`."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise MPIKVStoreError("%s must be %s, got %r"
                              % (name, "an integer" if kind is int else "a number", raw)) from None
    if value < 0:
        raise MPIKVStoreError("%s must be >= 0, got %r" % (name, raw))
    return value
