"""Qwen2-Audio's clips: vLLM's Qwen2AudioMultiModalProcessor, without torch.

vLLM 0.32 (model_executor/models/qwen2_audio.py) calls Qwen2AudioProcessor with
`truncation=True`, so every clip is cut to or padded to the extractor's 30 s: `input_features`
[clips, 128, 3000] and `feature_attention_mask` [clips, 3000] (int32), both batched, neither
kept on the CPU. Each clip's `<|AUDIO|>` (the template writes `Audio N: <|audio_bos|><|AUDIO|>
<|audio_eos|>`) becomes `<|AUDIO|>` repeated ((L-1)//2+1-2)//2+1 times for L = the mask's sum:
750 at most.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from multimodal.audio_decode import DecodedAudio
from multimodal.processors.base import ModelConfigs, ProcessedItems
from multimodal.processors.whisper_audio import (
    AudioProcessor,
    WhisperAudioSettings,
    clip_features,
    token_counts,
)

MODEL_TYPES = ("qwen2_audio",)
FEATURES = "input_features"
MASK = "feature_attention_mask"


def audio_placeholder(index: int) -> str:
    """vLLM's get_placeholder_str for a "string"-format chat prompt, numbered from 1 (Qwen2.5-Omni
    writes the same)."""
    return f"Audio {index}: <|audio_bos|><|AUDIO|><|audio_eos|>"


class Qwen2AudioProcessor(AudioProcessor):
    family = "qwen2_audio"
    title = "Qwen2-Audio"
    placeholder_text: ClassVar = staticmethod(audio_placeholder)
    truncate = True

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return files.config.get("model_type") in MODEL_TYPES

    def process(
        self, clips: Sequence[DecodedAudio], settings: WhisperAudioSettings, raw_pixels: bool
    ) -> ProcessedItems:
        features = [clip_features(clip, settings) for clip in clips]
        counts = token_counts(features)
        return ProcessedItems(
            tensors={
                FEATURES: np.stack([f.input_features for f in features]),
                MASK: np.stack([f.feature_attention_mask for f in features]),
            },
            batched_keys=(FEATURES, MASK),
            replacements=[[self.audio_token_id] * n for n in counts],
            encoder_key=FEATURES,
        )
