"""Qwen2.5-Omni's (thinker's) clips and images: vLLM's Qwen2_5OmniThinkerMultiModalProcessor.

Images: Qwen2VLImageProcessor, as for Qwen2-VL (`qwen_vl`), with the same tensors and field
layout; only the token differs: `<|IMAGE|>` between `<|vision_bos|>` and `<|vision_eos|>`.

Audio:
vLLM 0.32 (model_executor/models/qwen2_5_omni_thinker.py) calls Qwen2_5OmniProcessor without
truncation, and the released extractor's chunk_length is 300: every clip is padded to 300 s
(30,000 frames) and a 31 s clip keeps its 3,100 frames. vLLM then keeps each clip's real frames
only (`_postprocess_hf_mm_data`): `input_audio_features` [128, sum of lengths], flat along the
frame axis (dim 1) by `audio_feature_lengths` (int64, one per clip); `feature_attention_mask`
[clips, 30000] (int32) stays as well; the two small ones are kept on the CPU.

Here the features go on the wire frame-major, [sum of lengths, 128], flat along the first axis
as every flat tensor is; the engine moves the frame axis to where the model concatenates it
(dim 1, from vLLM's own field config). Each clip's `<|AUDIO|>` (the template writes
`<|audio_bos|><|AUDIO|><|audio_eos|>`) becomes `<|AUDIO|>` repeated ((L-1)//2+1-2)//2+1 times.
`use_audio_in_video` (a video's own sound track) is not taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from multimodal.audio_decode import DecodedAudio
from multimodal.processors.base import ModelConfigs, ProcessedItems
from multimodal.processors.qwen2_audio import audio_placeholder
from multimodal.processors.qwen_vl import QwenVLProcessor
from multimodal.processors.whisper_audio import (
    AudioProcessor,
    WhisperAudioSettings,
    clip_features,
    token_counts,
)

MODEL_TYPES = ("qwen2_5_omni", "qwen2_5_omni_thinker")
FEATURES = "input_audio_features"
MASK = "feature_attention_mask"
LENGTHS = "audio_feature_lengths"


class Qwen25OmniImageProcessor(QwenVLProcessor):
    family = "qwen25_omni"
    title = "Qwen2.5-Omni"
    placeholder_text = "<|vision_start|><|IMAGE|><|vision_end|>"  # vLLM's, as written
    image_token: ClassVar[str] = "<|IMAGE|>"  # the config names it under thinker_config only

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return files.config.get("model_type") in MODEL_TYPES


class Qwen25OmniAudioProcessor(AudioProcessor):
    family = "qwen25_omni_audio"
    title = "Qwen2.5-Omni"
    placeholder_text: ClassVar = staticmethod(audio_placeholder)
    truncate = False

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return files.config.get("model_type") in MODEL_TYPES

    def process(
        self, clips: Sequence[DecodedAudio], settings: WhisperAudioSettings, raw_pixels: bool
    ) -> ProcessedItems:
        features = [clip_features(clip, settings) for clip in clips]
        counts = token_counts(features)
        lengths = [f.feature_length for f in features]
        # The mask is a prefix of ones: a clip's real frames are its first `length`; the rest
        # of its 300 s (never sent) is not built.
        frames = [f.first_frames(n).T for f, n in zip(features, lengths)]
        return ProcessedItems(
            tensors={
                FEATURES: np.ascontiguousarray(np.concatenate(frames)),
                MASK: np.stack([f.feature_attention_mask for f in features]),
                LENGTHS: np.asarray(lengths, dtype=np.int64),
            },
            batched_keys=(MASK, LENGTHS),
            flat_keys={FEATURES: LENGTHS},
            keep_on_cpu_keys=(MASK, LENGTHS),
            replacements=[[self.audio_token_id] * n for n in counts],
            encoder_key=FEATURES,
        )
