"""What tests share: real engines and peers (engines, gateway_process, fake_worker), reference
implementations run offline (vllm_tokenize), test data and cases (images/, synthetic_images,
llava_models, e2e_cases) and small servers (http_files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the repository
IMAGES_DIR = Path(__file__).resolve().parent / "images"  # committed test images


def load_processor(path: Path, modality: str = "image") -> Any:
    """Our processor for a model directory, its files read as the gateway reads them."""
    from gateway.render.model_files import ModelFiles
    from multimodal.registry import processor_for

    return processor_for(ModelFiles.load(path), modality)


# The node id of the fast test being set up or run (tests/conftest.py), None for a slow one.
running_fast_test: str | None = None


def refuse_in_fast_tests(what: str) -> None:
    """Called by every peer that makes a test slow, as it starts."""
    if running_fast_test is not None:
        raise RuntimeError(
            f"{running_fast_test} starts {what}: mark it `slow` or move it under tests/e2e"
        )
