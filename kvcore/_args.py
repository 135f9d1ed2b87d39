"""Checks of plain arguments shared by the public API: each failure is an InvalidArgumentError."""

import numbers
from typing import Any, Optional

from .errors import InvalidArgumentError


def int_arg(value: Any, name: str, minimum: int = 0) -> int:
    """value as an int of at least ``minimum`` (an int or numpy integer, not a bool or float)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InvalidArgumentError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def optional_int_arg(value: Any, name: str, minimum: int = 0) -> Optional[int]:
    return None if value is None else int_arg(value, name, minimum)
