"""Which processors serve a model: per modality, the first family whose `matches` accepts it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from multimodal.processors.base import ItemProcessor, Modality, ModelConfigs, UnsupportedModel
from multimodal.processors.gemma3 import Gemma3Processor
from multimodal.processors.gemma4 import Gemma4Processor
from multimodal.processors.glm4v import Glm4vProcessor
from multimodal.processors.glm4v_video import Glm4vVideoProcessor
from multimodal.processors.idefics3 import Idefics3Processor, SmolVLMProcessor
from multimodal.processors.internvl import InternVLProcessor
from multimodal.processors.kimi_k25 import KimiK25Processor
from multimodal.processors.llama4 import Llama4Processor
from multimodal.processors.llava import LlavaProcessor
from multimodal.processors.llava_next import LlavaNextProcessor
from multimodal.processors.llava_onevision import (
    LlavaOnevisionProcessor,
    LlavaOnevisionVideoProcessor,
)
from multimodal.processors.pixtral import Mistral3Processor, PixtralHFProcessor
from multimodal.processors.qwen2_audio import Qwen2AudioProcessor
from multimodal.processors.qwen3_vl_video import Qwen3VLVideoProcessor
from multimodal.processors.qwen25_omni import Qwen25OmniAudioProcessor, Qwen25OmniImageProcessor
from multimodal.processors.qwen_vl import QwenVLProcessor
from multimodal.processors.qwen_vl_video import QwenVLVideoProcessor

FAMILIES: tuple[type[ItemProcessor], ...] = (
    QwenVLProcessor,
    LlavaProcessor,
    LlavaNextProcessor,
    LlavaOnevisionProcessor,
    Llama4Processor,
    Mistral3Processor,
    PixtralHFProcessor,
    Gemma3Processor,
    Gemma4Processor,
    Idefics3Processor,
    SmolVLMProcessor,
    InternVLProcessor,
    Glm4vProcessor,
    KimiK25Processor,
    Qwen25OmniImageProcessor,
    # videos
    QwenVLVideoProcessor,
    Qwen3VLVideoProcessor,
    Glm4vVideoProcessor,
    LlavaOnevisionVideoProcessor,
    # audio
    Qwen2AudioProcessor,
    Qwen25OmniAudioProcessor,
)

__all__ = ["FAMILIES", "ModelProcessors", "UnsupportedModel", "processor_for", "processors_for"]


@dataclass(frozen=True)
class ModelProcessors:
    """A model's processors, one per modality it takes; none for a text-only model."""

    by_modality: Mapping[Modality, ItemProcessor] = field(default_factory=dict)

    @property
    def placeholders(self) -> dict[Modality, str | Callable[[int], str]]:
        """The text vLLM writes per item into a "string"-format chat prompt, per modality: a
        function of the item's number among its modality's (from 1) where vLLM numbers them
        (the audio families' "Audio N: ...")."""
        return {m: p.placeholder_text for m, p in self.by_modality.items()}

    def get(self, modality: Modality) -> ItemProcessor:
        processor = self.by_modality.get(modality)
        if processor is None:
            raise UnsupportedModel(
                f"the gateway has no {modality} processor for this model; let the engine "
                f"workers preprocess its {modality}s (mmgate serve --mm-processing auto, "
                "workers with --mm-processor inprocess)",
                param="messages",
            )
        return processor


def processors_for(files: ModelConfigs) -> ModelProcessors:
    found: dict[Modality, ItemProcessor] = {}
    for family in FAMILIES:
        if family.modality not in found and family.matches(files):
            found[family.modality] = family.from_files(files)
    return ModelProcessors(found)


def processor_for(files: ModelConfigs, modality: Modality = "image") -> ItemProcessor:
    """The model's processor for `modality`, or UnsupportedModel naming its model_type."""
    processor = processors_for(files).by_modality.get(modality)
    if processor is None:
        raise UnsupportedModel(
            f"no {modality} processor for model_type {files.config.get('model_type')!r}"
        )
    return processor
