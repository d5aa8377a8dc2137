"""Audio items for models with a Whisper feature extractor (Qwen2-Audio, Qwen2.5-Omni's thinker).

What vLLM 0.32's chat path does with an audio part, step for step: its loader decodes the clip
at its own rate and averages the channels (`multimodal.audio_decode`, `DecodedAudio.mono`);
the model's data parser resamples the mono samples to the feature extractor's `sampling_rate`
with torchaudio's `Resample` (`multimodal.audio_resample`; a clip already at that rate is left
as it is); the HF processor runs WhisperFeatureExtractor with `padding="max_length"` (to the
extractor's n_samples, chunk_length x sampling_rate) and the attention mask
(`multimodal.audio_features`), truncating or not as the model's vLLM processor asks. Each clip
is processed alone: the extractor's features, clamp and mask are per clip, so a batch is its
clips side by side.

The family files (`qwen2_audio`, `qwen25_omni_audio`) lay the features out as their vLLM
processors hand them to the model and name the audio token each clip's placeholder repeats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from multimodal.audio_decode import DecodedAudio
from multimodal.audio_features import (
    HOP_LENGTH,
    N_FFT,
    SAMPLING_RATE,
    AudioFeatures,
    audio_token_count,
    extract_features,
)
from multimodal.audio_resample import resample
from multimodal.errors import MediaDecodeError
from multimodal.processors.base import ItemProcessor, Modality, ModelConfigError

__all__ = ["AudioProcessor", "WhisperAudioSettings", "clip_features", "token_counts"]


@dataclass(frozen=True)
class WhisperAudioSettings:
    """The feature extractor's settings that change a clip's tensors (part of its hash)."""

    feature_size: int  # mel bins: 128 for both families
    sampling_rate: int  # what clips are resampled to
    chunk_samples: int  # what clips are padded to: chunk_length x sampling_rate
    truncate: bool  # cut past chunk_samples (Qwen2-Audio) or not (Omni)

    @classmethod
    def from_config(
        cls, pre: Mapping[str, Any], truncate: bool, title: str
    ) -> WhisperAudioSettings:
        """From the model's feature extractor config, with WhisperFeatureExtractor's defaults
        for what it leaves out. It computes n_samples from chunk_length itself (a config's
        own `n_samples` is overwritten), so that is read here too."""
        kind = pre.get("feature_extractor_type", "WhisperFeatureExtractor")
        rate = int(pre.get("sampling_rate", SAMPLING_RATE))
        fixed = {
            "feature_extractor_type": (kind, "WhisperFeatureExtractor"),
            "sampling_rate": (rate, SAMPLING_RATE),
            "n_fft": (int(pre.get("n_fft", N_FFT)), N_FFT),
            "hop_length": (int(pre.get("hop_length", HOP_LENGTH)), HOP_LENGTH),
            # Dithering adds random noise to every frame: no two runs agree.
            "dither": (float(pre.get("dither", 0.0)), 0.0),
        }
        for name, (value, expected) in fixed.items():
            if value != expected:
                raise ModelConfigError(
                    f"{title}: the feature extractor's {name} is {value!r}; the gateway "
                    f"computes features for {expected!r} only (use --mm-processing worker)"
                )
        chunk_length = pre.get("chunk_length", 30)
        return cls(
            feature_size=int(pre.get("feature_size", 80)),
            sampling_rate=rate,
            chunk_samples=int(chunk_length * rate),
            truncate=truncate,
        )


def clip_features(audio: DecodedAudio, settings: WhisperAudioSettings) -> AudioFeatures:
    """One decoded clip's features: mono, resampled, then the extractor's."""
    mono = audio.mono()
    if audio.sample_rate != settings.sampling_rate:
        mono = resample(mono, audio.sample_rate, settings.sampling_rate)
    return extract_features(
        mono,
        num_mel_filters=settings.feature_size,
        truncate=settings.truncate,
        chunk_samples=settings.chunk_samples,
    )


def token_counts(features: Sequence[AudioFeatures]) -> list[int]:
    """Each clip's audio tokens; a clip too short for one (under 3 frames: 20 ms) is refused
    as vLLM refuses it ("too short to be represented inside the model")."""
    counts = []
    for index, clip in enumerate(features):
        count = audio_token_count(clip.feature_length)
        if count <= 0:
            raise MediaDecodeError(
                f"the audio ({clip.feature_length} feature frames) is too short to be "
                "represented inside the model",
                index=index,
                kind="audio",
            )
        counts.append(count)
    return counts


class AudioProcessor(ItemProcessor):
    """A family's audio clips: `process` takes `DecodedAudio`s (`multimodal.audio_decode`),
    decoded at their own rate; `settings` (its `defaults`) says how they become features.
    No per-request options: vLLM's audio processors take none that change the features."""

    modality: ClassVar[Modality] = "audio"
    truncate: ClassVar[bool]
    default_audio_token: ClassVar[str] = "<|AUDIO|>"

    def __init__(self, settings: WhisperAudioSettings, audio_token_id: int) -> None:
        self.settings = settings
        self.audio_token_id = audio_token_id
        self.defaults = settings

    @classmethod
    def from_files(cls, files: Any) -> AudioProcessor:
        settings = WhisperAudioSettings.from_config(
            files.audio_preprocessor, cls.truncate, cls.title
        )
        return cls(settings, cls.audio_token(files))

    @classmethod
    def audio_token(cls, files: Any) -> int:
        """The audio token's id: the config's, else the tokenizer's `audio_token`."""
        config = files.config
        for source in (config, config.get("thinker_config") or {}):
            for key in ("audio_token_id", "audio_token_index"):
                if source.get(key) is not None:
                    return int(source[key])
        name = files.named_tokens.get("audio_token", cls.default_audio_token)
        return int(files.vocab[name])

    @property
    def anchor_token_id(self) -> int:
        return self.audio_token_id

    def resolve(self, kwargs: Mapping[str, Any]) -> WhisperAudioSettings:
        # A request's mm_processor_kwargs are the image processor's (Omni's max_pixels) or
        # none: vLLM's audio path takes no per-request setting, so none is refused here.
        return self.settings
