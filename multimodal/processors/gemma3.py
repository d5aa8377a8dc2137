"""Gemma 3 images: one fixed-size SigLIP input per image, plus optional pan-and-scan crops.

Mirrors transformers' Gemma3ImageProcessor (torchvision backend, which vLLM runs): each image is
resized straight to size x size (896 in the released checkpoints, bilinear, no aspect kept),
then rescaled and normalized (mean/std 0.5) in float32. With pan-and-scan on, an image whose
aspect ratio reaches `pan_and_scan_min_ratio_to_activate` is also cut into 2..max_num_crops
equal crops along its long side (the last one cut short at the edge), each resized the same
way; the whole image comes first, then its crops. The tensors are laid out as vLLM's
Gemma3MultiModalProcessor fields them: `pixel_values` flat over all crops, split per image by
`num_patches` (crops + 1, batched, kept on CPU).

The chat template writes `<start_of_image>` once per image. vLLM (get_image_repl) replaces it
with "\\n\\n<start_of_image>" + mm_tokens_per_image x `<image_soft_token>` +
"<end_of_image>\\n\\n", and with crops with "Here is the original image {that} and here are
some crops to help you see better {that} {that} ..."; only the soft tokens are embeddings.
Where this follows vLLM over transformers:
- token ids: vLLM encodes the replacement on its own and then fuses the newline tokens it put
  next to the prompt's ("\\n" + "\\n\\n" and "\\n\\n" + "\\n" into "\\n\\n\\n", "\\n\\n" + "\\n\\n"
  into "\\n\\n\\n\\n", in three passes over the whole prompt: `finish_prompt`); transformers
  tokenizes the expanded text in one go, which agrees except on runs of 5+ newlines;
- placeholder ranges: vLLM's start at the (fused) token holding the replacement's first token
  and are as long as the replacement; two images in a row then share their fused "\\n\\n\\n\\n",
  so the first range is cut short by that token here (the engine refuses overlapping ranges;
  the token is not an embedding either way);
- pan-and-scan defaults: Gemma3Processor's (off, 256 px, 4 crops, ratio 1.2), which override
  the preprocessor config's values in transformers 5 and so in vLLM.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from multimodal.processors.base import (
    ItemProcessor,
    ModelConfigError,
    ModelConfigs,
    OptionError,
    ProcessedItems,
    matches_model,
)
from multimodal.processors.options import first_set, option
from multimodal.processors.pixels import PixelPipeline, PixelSettings, pixel_settings
from multimodal.processors.transforms import tiles_into
from multimodal.prompt import Range

MODEL_TYPES = ("gemma3",)
IMAGE_PROCESSORS = ("Gemma3ImageProcessor",)
BOI, EOI, IMAGE_SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
NEWLINES = ("\n", "\n\n", "\n\n\n", "\n\n\n\n")
SIZES_KEY = "num_patches"
# Gemma3ImageProcessor's class defaults, under whatever the preprocessor config sets.
PIXEL_DEFAULTS: dict[str, Any] = {
    "size": {"height": 224, "width": 224},
    "resample": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_center_crop": False,
}


@dataclass(frozen=True)
class Gemma3Options:
    """mm_processor_kwargs for Gemma 3 images: Gemma3ImageProcessor's pan-and-scan keys."""

    do_pan_and_scan: bool | None = option(doc="add crops of images of a wide aspect ratio")
    pan_and_scan_min_crop_size: int | None = option(minimum=1, doc="smallest crop side, px")
    pan_and_scan_max_num_crops: int | None = option(minimum=1, doc="most crops per image")
    pan_and_scan_min_ratio_to_activate: float | None = option(doc="least long/short side")


@dataclass(frozen=True)
class PanAndScan:
    """One request's pan-and-scan settings: its options over the model's defaults."""

    enabled: bool
    min_crop_size: int
    max_num_crops: int
    min_ratio_to_activate: float


# Gemma3ProcessorKwargs._defaults: transformers 5 passes them to the image processor on every
# call, over the preprocessor config's own values; vLLM counts crops from the same merge.
DEFAULT_PAN_AND_SCAN = PanAndScan(
    enabled=False, min_crop_size=256, max_num_crops=4, min_ratio_to_activate=1.2
)


@dataclass(frozen=True)
class Gemma3Tokens:
    """The ids vLLM looks up in the vocabulary: the anchor, the embedding token, the newlines
    it fuses."""

    boi: int
    soft: int
    newlines: tuple[int, int, int, int]  # "\n" ... "\n\n\n\n"


def replacement_text(num_crops: int, tokens_per_image: int) -> str:
    """vLLM's Gemma3ProcessingInfo.get_image_repl text for an image with this many crops."""
    sequence = f"\n\n{BOI}{IMAGE_SOFT * tokens_per_image}{EOI}\n\n"  # full_image_sequence
    if num_crops == 0:
        return sequence
    crops = " ".join([sequence] * num_crops)
    return (
        f"Here is the original image {sequence} and here are some crops to help you see "
        f"better {crops}"
    )


def crop_grid(height: int, width: int, pas: PanAndScan) -> tuple[int, int]:
    """vLLM's Gemma3ProcessingInfo.get_num_crops (= Gemma3ImageProcessor.pan_and_scan) as
    (rows, columns) of crops; (0, 0) for none."""
    if not pas.enabled:
        return 0, 0
    long, short = (width, height) if width >= height else (height, width)
    if long / short < pas.min_ratio_to_activate:
        return 0, 0
    count = min(int(math.floor(long / pas.min_crop_size)), int(math.floor(long / short + 0.5)))
    count = min(pas.max_num_crops, max(2, count))
    rows, cols = (1, count) if width >= height else (count, 1)
    if min(math.ceil(width / cols), math.ceil(height / rows)) < pas.min_crop_size:
        return 0, 0
    return rows, cols


def crop_windows(height: int, width: int, rows: int, cols: int) -> list[tuple[int, int, int, int]]:
    """The crops' (top, left, height, width), row by row: ceil-sized steps, the last ones cut
    short at the image's edge, as slicing does in transformers."""
    step_h, step_w = math.ceil(height / rows), math.ceil(width / cols)
    windows = []
    for top in range(0, rows * step_h, step_h):
        for left in range(0, cols * step_w, step_w):
            h, w = min(step_h, height - top), min(step_w, width - left)
            if h <= 0 or w <= 0:
                # transformers would hand torchvision an empty crop; vLLM counts it all the same.
                raise OptionError(
                    f"pan-and-scan would cut an empty crop from this {width}x{height} image; "
                    "raise mm_processor_kwargs.pan_and_scan_min_crop_size"
                )
            windows.append((top, left, h, w))
    return windows


def fuse_newlines(ids: Sequence[int], newlines: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """vLLM's Gemma3MultiModalProcessor._apply_token_matches: "\\n" "\\n\\n", then "\\n\\n" "\\n",
    become "\\n\\n\\n", then "\\n\\n" "\\n\\n" becomes "\\n\\n\\n\\n": three passes over the whole
    prompt, each left to right without overlaps. Returns the ids and, per pass, where it fused
    a pair (positions in the ids as that pass found them)."""
    n1, n2, n3, n4 = newlines
    out = list(ids)
    passes: list[list[int]] = []
    for first, second, into in ((n1, n2, n3), (n2, n1, n3), (n2, n2, n4)):
        found = _pairs(out, first, second)
        for position in reversed(found):
            out[position : position + 2] = [into]
        passes.append(found)
    return out, passes


def _pairs(ids: list[int], first: int, second: int) -> list[int]:
    """Where `first` `second` starts, leftmost first and not overlapping (replace_token_matches)."""
    found: list[int] = []
    start = 0
    while True:
        try:
            position = ids.index(first, start)
        except ValueError:
            return found
        if position + 1 < len(ids) and ids[position + 1] == second:
            found.append(position)
            start = position + 2
        else:
            start = position + 1


class Gemma3Processor(ItemProcessor):
    family = "gemma3"
    title = "Gemma 3"
    options = Gemma3Options
    defaults = DEFAULT_PAN_AND_SCAN
    placeholder_text = BOI  # Gemma3ForConditionalGeneration.get_placeholder_str

    def __init__(
        self,
        pixels: PixelSettings,
        tokens: Gemma3Tokens,
        tokens_per_image: int,
        encode: Callable[[str], list[int]],
    ) -> None:
        """`encode`: the tokenizer, as vLLM encodes a replacement (no special tokens added)."""
        self.pixels = PixelPipeline(pixels)
        self.tokens = tokens
        self.tokens_per_image = tokens_per_image
        self.size = pixels.resize_hw
        self._encode = encode
        # Crop counts repeat (0 unless pan-and-scan is asked for): encode each count once.
        self._replacement = functools.lru_cache(maxsize=16)(self._encoded_replacement)

    @classmethod
    def matches(cls, files: ModelConfigs) -> bool:
        return matches_model(files, MODEL_TYPES, IMAGE_PROCESSORS)

    @classmethod
    def from_files(cls, files: ModelConfigs) -> Gemma3Processor:
        config = files.config
        pixels = _pixels(files.preprocessor)
        image_size = int((config.get("vision_config") or {}).get("image_size", 224))
        if pixels.resize_hw != (image_size, image_size):
            raise ModelConfigError(
                f"Gemma 3 preprocessor size {pixels.resize_hw} is not the vision tower's "
                f"{image_size}x{image_size}"
            )
        per_image = int(config.get("mm_tokens_per_image", 256))
        encode = functools.partial(_encode, files.tokenizer)
        return cls(pixels, _tokens(files.vocab), per_image, encode)

    @property
    def anchor_token_id(self) -> int:
        return self.tokens.boi

    def settings_for(self, options: Gemma3Options) -> PanAndScan:
        d = DEFAULT_PAN_AND_SCAN
        return PanAndScan(
            enabled=first_set(options.do_pan_and_scan, d.enabled),
            min_crop_size=first_set(options.pan_and_scan_min_crop_size, d.min_crop_size),
            max_num_crops=first_set(options.pan_and_scan_max_num_crops, d.max_num_crops),
            min_ratio_to_activate=first_set(
                options.pan_and_scan_min_ratio_to_activate, d.min_ratio_to_activate
            ),
        )

    def num_crops(self, height: int, width: int, settings: PanAndScan) -> int:
        rows, cols = crop_grid(height, width, settings)
        return rows * cols

    def replacement(self, num_crops: int) -> list[int]:
        """vLLM's get_image_repl for an image with this many crops, as token ids: its text
        encoded whole, as vLLM encodes it (so any merge the tokenizer makes across the text's
        pieces is made here too)."""
        return list(self._replacement(num_crops))

    def _encoded_replacement(self, num_crops: int) -> tuple[int, ...]:
        return tuple(self._encode(replacement_text(num_crops, self.tokens_per_image)))

    def process(
        self, images: Sequence[np.ndarray], settings: PanAndScan, raw_pixels: bool
    ) -> ProcessedItems:
        windows = [self._windows(image, settings) for image in images]
        counts = [len(w) for w in windows]  # crops + 1 (the whole image) per image
        side_h, side_w = self.size
        dtype = self.pixels.out_dtype(raw_pixels)
        out = np.empty((sum(counts), 3, side_h, side_w), dtype)
        tiles = iter(out)
        for image, image_windows in zip(images, windows):
            for window in image_windows:
                self._tile(image, window, dtype is np.uint8, next(tiles))
        return ProcessedItems(
            tensors={"pixel_values": out, SIZES_KEY: np.asarray(counts, dtype=np.int64)},
            batched_keys=(SIZES_KEY,),
            flat_keys={"pixel_values": SIZES_KEY},
            keep_on_cpu_keys=(SIZES_KEY,),
            replacements=[self.replacement(count - 1) for count in counts],
            embed_token_id=self.tokens.soft,
        )

    def finish_prompt(
        self, ids: list[int], ranges: list[list[Range]]
    ) -> tuple[list[int], list[list[Range]]]:
        fused_ids, passes = fuse_newlines(ids, self.tokens.newlines)
        if not any(passes):
            return ids, ranges
        return fused_ids, _moved_ranges(ranges, passes)

    def _windows(self, image: np.ndarray, settings: PanAndScan) -> list[tuple[int, int, int, int]]:
        """The whole image's window, then its crops'."""
        height, width = image.shape[:2]
        whole = [(0, 0, height, width)]
        rows, cols = crop_grid(height, width, settings)
        return whole + (crop_windows(height, width, rows, cols) if rows else [])

    def _tile(
        self, image: np.ndarray, window: tuple[int, int, int, int], raw: bool, out: np.ndarray
    ) -> None:
        """A window of the image resized to the tower's size, into `out` (3 x H x W; uint8
        when `raw`, else rescaled/normalized float32)."""
        top, left, h, w = window
        side_h, side_w = self.size
        planes = out if raw else np.empty(out.shape, np.uint8)
        crop = image[top : top + h, left : left + w]
        method = self.pixels.settings.method
        tiles_into(crop, side_h, side_w, method, planes.reshape(1, 1, 3, side_h, side_w))
        if not raw:
            self.pixels.normalize(planes, out)


def _moved_ranges(ranges: list[list[Range]], passes: list[list[int]]) -> list[list[Range]]:
    """Each range moved as vLLM's placeholders move (`passes`: fuse_newlines' fusions), then
    cut short where it would overlap the next one."""

    def moved(position: int) -> int:
        # A pass's fusion at p moves every later position one to the left, p + 1 onto p;
        # the passes are replayed in order, as each counts in its own ids.
        for found in passes:
            position -= bisect.bisect_left(found, position)
        return position

    starts = [[(moved(o), n) for o, n in group] for group in ranges]
    order = sorted((o, g, i) for g, group in enumerate(starts) for i, (o, _) in enumerate(group))
    out = [list(group) for group in starts]
    for (offset, g, i), (next_offset, _, _) in zip(order, order[1:]):
        length = out[g][i][1]
        out[g][i] = (offset, min(length, next_offset - offset))
    return out


def _pixels(pre: Mapping[str, Any]) -> PixelSettings:
    # Released configs carry nulls for unset keys: the class defaults hold there.
    given = {k: v for k, v in pre.items() if v is not None}
    settings = pixel_settings({**PIXEL_DEFAULTS, **given, "do_center_crop": False})
    if settings.resize_hw is None or not settings.do_resize:
        raise ModelConfigError("Gemma 3 needs a fixed resize size (size.height, size.width)")
    return settings


def _tokens(vocab: Mapping[str, int]) -> Gemma3Tokens:
    # vLLM looks these up in the tokenizer's vocabulary (not config.json's ids), as here.
    try:
        boi, soft, *newlines = (vocab[t] for t in (BOI, IMAGE_SOFT, *NEWLINES))
    except KeyError as error:
        raise ModelConfigError(f"the vocabulary has no token {error.args[0]!r}") from None
    return Gemma3Tokens(boi=boi, soft=soft, newlines=tuple(newlines))  # type: ignore[arg-type]


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids
