"""The reference libraries the audio tests compare against, imported so that a missing one fails
the test with how to install it instead of skipping it: a skipped fidelity test proves nothing."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

_INSTALL = {
    "torchaudio": "pip install torchaudio (a release that accepts the installed torch)",
    "soundfile": "pip install soundfile",
    "av": "pip install av",
}


def require(module: str) -> ModuleType:
    """`module` imported, or the test failed with the pip command that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        hint = _INSTALL.get(top, f"pip install {top}")
        pytest.fail(f"reference {module!r} is not importable ({exc}); {hint}", pytrace=False)
