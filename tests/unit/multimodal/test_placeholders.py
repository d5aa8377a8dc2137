"""The placeholder table (multimodal/placeholders.json), read without vLLM, and, as a slow test,
compared with the vLLM installed."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from multimodal import placeholders
from multimodal.placeholders import known_modalities, placeholder_for

MODULE = Path(placeholders.__file__)
MODALITIES = ("image", "video", "audio")

# Compared with vLLM by the slow test; Aya Vision left vLLM in 0.24, so it is in neither.
SAMPLE = (
    "AyaVisionForConditionalGeneration",
    "Gemma3ForConditionalGeneration",
    "InternVLChatModel",
    "Llama4ForConditionalGeneration",
    "LlavaForConditionalGeneration",
    "Mistral3ForConditionalGeneration",
    "Phi3VForCausalLM",
    "Phi4MMForCausalLM",
    "Qwen2AudioForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
    "Qwen2_5OmniForConditionalGeneration",
    "TransformersMultiModalForCausalLM",
)


def test_an_index_template_takes_the_items_index():
    assert placeholder_for(["Phi3VForCausalLM"], "image", 1) == "<|image_1|>"
    assert placeholder_for(["Phi3VForCausalLM"], "image", 12) == "<|image_12|>"
    assert placeholder_for(["Qwen2AudioForConditionalGeneration"], "audio", 2) == (
        "Audio 2: <|audio_bos|><|AUDIO|><|audio_eos|>"
    )


def test_a_plain_placeholder_is_the_same_for_every_item():
    qwen = ["Qwen2VLForConditionalGeneration"]
    assert placeholder_for(qwen, "image", 1) == "<|vision_start|><|image_pad|><|vision_end|>"
    assert placeholder_for(qwen, "image", 3) == "<|vision_start|><|image_pad|><|vision_end|>"
    assert placeholder_for(qwen, "video", 2) == "<|vision_start|><|video_pad|><|vision_end|>"
    assert known_modalities(qwen) == {"image", "video"}


def test_an_unknown_architecture_has_none():
    assert placeholder_for(["NoSuchModelForCausalLM"], "image", 1) is None
    assert placeholder_for([], "image", 1) is None
    assert known_modalities(["NoSuchModelForCausalLM"]) == frozenset()


def test_a_modality_the_model_writes_nothing_for_has_none():
    assert placeholder_for(["LlavaForConditionalGeneration"], "audio", 1) is None
    # Mistral 3 takes images, but its chat template places them itself.
    assert placeholder_for(["Mistral3ForConditionalGeneration"], "image", 1) is None
    assert known_modalities(["Mistral3ForConditionalGeneration"]) == frozenset()


def test_the_first_known_architecture_wins():
    assert placeholder_for(["NoSuchModel", "LlavaForConditionalGeneration"], "image", 1) == (
        "<image>"
    )
    # Known, with nothing written: a later architecture does not fill in, as in vLLM.
    archs = ["Mistral3ForConditionalGeneration", "LlavaForConditionalGeneration"]
    assert placeholder_for(archs, "image", 1) is None


def test_one_architecture_may_be_given_as_a_string():
    assert placeholder_for("LlavaForConditionalGeneration", "image", 1) == "<image>"


def test_the_table_is_well_formed():
    data = json.loads(MODULE.with_name("placeholders.json").read_text(encoding="utf-8"))
    assert set(data) == {"vllm_version", "architectures"}
    assert data["vllm_version"] == placeholders.vllm_version()
    assert len(data["architectures"]) > 100
    for architecture, entry in data["architectures"].items():
        assert set(entry) <= set(MODALITIES), architecture
        for text in entry.values():
            assert isinstance(text, str) and text, architecture


def test_the_loader_does_not_import_vllm_or_torch():
    imported = set()
    for node in ast.walk(ast.parse(MODULE.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"vllm", "torch", "transformers"}


def _vllm_placeholder(model_cls: type, modality: str, index: int) -> str | None:
    try:
        return model_cls.get_placeholder_str(modality, index)
    except Exception:
        return None


@pytest.mark.slow
def test_the_table_is_what_the_installed_vllm_writes():
    import vllm
    from vllm.model_executor.models.registry import ModelRegistry

    assert placeholders.vllm_version() == vllm.__version__, (
        "regenerate the table: scripts/gen_placeholders.py"
    )
    for architecture in SAMPLE:
        registered = ModelRegistry.models.get(architecture)
        if registered is None:
            assert known_modalities([architecture]) == frozenset(), architecture
            assert placeholder_for([architecture], "image", 1) is None, architecture
            continue
        model_cls = registered.load_model_cls()
        for modality in MODALITIES:
            for index in (1, 2, 3):
                expected = _vllm_placeholder(model_cls, modality, index)
                got = placeholder_for([architecture], modality, index)
                assert got == expected, (architecture, modality, index)
        written = {m for m in MODALITIES if _vllm_placeholder(model_cls, m, 1) is not None}
        assert known_modalities([architecture]) == written, architecture
