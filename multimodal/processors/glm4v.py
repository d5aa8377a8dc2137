"""GLM-4.1V, GLM-4.5V and GLM-4.6V images: Qwen-VL's patches under GLM's own resize rule.

transformers' Glm4vImageProcessor and Glm46VImageProcessor (torchvision backend, what vLLM
runs; the two are the same code) lay out patches exactly as Qwen2-VL does: bicubic resize to
multiples of patch*merge (28), each patch a row of (channel, temporal copy, row, column),
`image_grid_thw` (1, h, w). So this family is the Qwen-VL processor (qwen_vl.py, with its
native resize+patch kernel) with GLM's differences only:
- the resize rule (`target_size`): an image under 28 px on a side is first scaled up, in
  float then truncated, until its short side is 28; the pixel bounds hold for
  temporal_patch_size x height x width (a still image counts its two temporal copies, so the
  released 112^2 .. 9,633,792 bounds allow 6,272 .. 4,816,896 pixels);
- the token: `<|image|>` (config.image_token_id), which the chat template writes between
  `<|begin_of_image|>` and `<|end_of_image|>`; vLLM's `get_placeholder_str` writes all three,
  and its prompt replacement (Glm4vMultiModalProcessor) turns the one `<|image|>` into
  t*h*w / merge^2 of them, the begin/end tokens outside the placeholder range;
- the per-request options: transformers takes only `size`, with both `shortest_edge` and
  `longest_edge` (one alone is its ValueError, a failed request in vLLM); `min_pixels` and
  `max_pixels`, Qwen's names, it ignores with a warning, so they are refused here rather than
  silently dropped. vLLM passes mm_processor_kwargs to the processor as given.

For images vLLM and transformers agree: vLLM's Glm4vMultiModalProcessor (which serves all
three model types; vLLM 0.32 has no class of its own for `glm46v`) calls transformers'
processor and replaces `<|image|>` with what it expanded to. vLLM 0.32 normalizes GLM pixels
on device (Glm4vForConditionalGeneration sets `supports_mm_device_do_normalize`): by default
the engine takes the uint8 patches.
"""

from __future__ import annotations

from dataclasses import dataclass

from multimodal.processors.base import ModelConfigError, ModelConfigs, matches_model
from multimodal.processors.options import OptionError
from multimodal.processors.qwen_vl import (
    QwenVLProcessor,
    QwenVLResize,
    QwenVLSize,
    smart_resize,
)

MODEL_TYPES = ("glm4v", "glm4v_moe", "glm46v")
IMAGE_PROCESSORS = ("Glm4vImageProcessor", "Glm46VImageProcessor")


@dataclass(frozen=True)
class Glm4vOptions:
    """mm_processor_kwargs for GLM-4.xV images: `size` (min and max pixels, counted with the
    temporal copy), both bounds at once as transformers requires."""

    size: QwenVLSize | None = None


class Glm4vProcessor(QwenVLProcessor):
    family = "glm4v"
    title = "GLM-4.xV"
    options = Glm4vOptions
    placeholder_text = "<|begin_of_image|><|image|><|end_of_image|>"
    image_token = "<|image|>"
    default_pixels = (112 * 112, 28 * 28 * 15000)  # Glm4vImageProcessor.size

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return matches_model(files, MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> Glm4vProcessor:
        pre = files.preprocessor
        # What the shared kernel cannot reproduce; the released configs set none of these
        # (unset or null: the image processor's defaults, bicubic and every step on).
        if pre.get("resample") not in (None, 3):
            raise ModelConfigError("GLM-4.xV images are resized bicubic only (resample 3)")
        for flag in ("do_resize", "do_rescale", "do_normalize"):
            if pre.get(flag) is False:
                raise ModelConfigError(f"GLM-4.xV preprocessing with {flag} off is not supported")
        return super().from_files(files)

    def settings_for(self, options: Glm4vOptions) -> QwenVLResize:
        if options.size is None:
            return self.defaults
        least, most = options.size.shortest_edge, options.size.longest_edge
        if least is None or most is None:
            raise OptionError(
                "mm_processor_kwargs.size needs both shortest_edge and longest_edge "
                "(GLM-4.xV's image processor takes neither alone)"
            )
        # A minimum above the maximum is not refused: transformers resizes within the
        # maximum then (its first test), and so does this.
        return QwenVLResize(min_pixels=least, max_pixels=most)

    def target_size(self, height: int, width: int, bounds: QwenVLResize) -> tuple[int, int]:
        """transformers' glm4v smart_resize for one still image (num_frames = temporal patch)."""
        s = self.settings
        factor = s.patch_size * s.merge_size
        if height < factor or width < factor:
            scale = max(factor / height, factor / width)
            height, width = int(height * scale), int(width * scale)
        return smart_resize(
            height, width, factor, bounds.min_pixels, bounds.max_pixels, s.temporal_patch_size
        )
