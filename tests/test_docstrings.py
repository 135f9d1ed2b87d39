"""The examples in kvcore's docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import kvcore


def modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(kvcore.__path__, "kvcore.") if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", modules())
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
