"""Kimi-K2.5 preprocessing against what vLLM 0.32 runs (its KimiK25MultiModalProcessor over its
own KimiK25FusedVisionProcessor, read from the released media_proc_cfg) and against
transformers' Kimi_K25Processor (torchvision backend), on the committed and synthetic images.

Two model dirs (configs, tokenizer, preprocessor config; no weights): the released limits
(16384 patches, 512 a side), under which none of the test images is scaled, and the e2e
model's 256 patches, under which most are (Pillow's bicubic in vLLM, torchvision's in
transformers: there the pixels follow vLLM).
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest

from multimodal.decode import decode_pixels
from multimodal.pipeline import PixelEncoding, prepare
from multimodal.policy import MediaPolicy
from multimodal.processors.base import ModelConfigError, OptionError
from multimodal.processors.kimi_k25 import (
    GRID_KEY,
    SIZES_KEY,
    KimiK25Processor,
    KimiMedia,
    NavitSize,
    navit_size,
    normalize,
)
from multimodal.prompt import Placeholders, expand
from tests.support import IMAGES_DIR, load_processor
from tests.support.e2e_cases import make_image
from tests.support.kimi_k25_models import MEDIA_PAD, TINY_PATCHES, build_model
from tests.support.synthetic_images import IMAGES

COMMITTED = sorted(IMAGES_DIR.glob("*.[jp][pn]g"))
MIXED = ["tall", "large", "tiny", "odd", "very thin"]
WIDE = make_image(1900, 700, seed=9)  # over 256 patches and 512 x 14 px wide: scaled down


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("kimi") / "released", weights=False, tiny=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("kimi") / "tiny", weights=False, tiny=True)


@pytest.fixture(scope="module")
def hf(released):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(released)
    # transformers' own image processor (torchvision backend); it ignores media_proc_cfg and
    # keeps its defaults, which are the released values.
    image_processor = processor.image_processor
    assert type(image_processor).__name__ == "Kimi_K25ImageProcessor"
    assert type(image_processor).__mro__[1].__name__ == "TorchvisionBackend"
    assert (image_processor.max_patches, image_processor.size.max_height) == (16384, 512)
    return processor


@pytest.fixture(scope="module")
def ours(released) -> KimiK25Processor:
    return load_processor(released)


@pytest.fixture(scope="module")
def tiny_ours(tiny) -> KimiK25Processor:
    return load_processor(tiny)


@pytest.fixture(scope="module")
def vllm_processor(tiny):
    """vLLM's KimiK25MultiModalProcessor on the 256-patch dir (bfloat16, as the e2e engines)."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    config = ModelConfig(
        model=str(tiny),
        max_model_len=4096,
        dtype="bfloat16",
        limit_mm_per_prompt={"vision_chunk": 8},
    )
    processor = MULTIMODAL_REGISTRY.create_processor(config)
    assert type(processor.info.image_processor).__name__ == "KimiK25FusedVisionProcessor"
    return processor


def chat_text(tokenizer, count: int) -> str:
    content = [{"type": "image"}] * count + [{"type": "text", "text": "Describe."}]
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def assert_pixels(have: np.ndarray, want: np.ndarray, raw: bool) -> float:
    assert have.shape == want.shape
    assert have.dtype == want.dtype == (np.uint8 if raw else np.float32)
    diff = float(np.abs(have.astype(np.float64) - want.astype(np.float64)).max())
    assert diff <= (0 if raw else 1e-5), f"max abs diff {diff}"
    return diff


def check(hf, ours, images, raw: bool, hf_images=None):
    """Ours against transformers' processor on the same chat prompt; returns ours."""
    text = chat_text(hf.tokenizer, len(images))
    extra = {"do_rescale": False, "do_normalize": False} if raw else {}
    want = hf(text=[text], images=hf_images or images, return_tensors="np", **extra)
    got = ours.process([np.asarray(i) for i in images], ours.resolve({}), raw_pixels=raw)
    assert_pixels(got.tensors["pixel_values"], want["pixel_values"], raw)
    grids = got.tensors[GRID_KEY]
    assert grids.dtype == np.int64 and np.array_equal(grids, want["image_grid_thw"])
    assert got.tensors[SIZES_KEY].tolist() == [int(np.prod(g)) for g in grids]
    assert got.batched_keys == (GRID_KEY, SIZES_KEY)
    assert got.flat_keys == {"pixel_values": SIZES_KEY}
    assert got.keep_on_cpu_keys == (GRID_KEY,) and got.embed_token_id is None
    unexpanded = hf.tokenizer(text)["input_ids"]
    ids, (ranges,) = expand(
        unexpanded, [Placeholders("image", ours.anchor_token_id, got.replacements)]
    )
    assert ids == want["input_ids"][0].tolist()
    pad = hf.tokenizer.convert_tokens_to_ids(MEDIA_PAD)
    for (offset, length), grid in zip(ranges, grids.tolist()):
        assert ids[offset : offset + length] == [pad] * (grid[1] * grid[2] // 4)
    return got


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("name", IMAGES)
def test_one_image_matches_transformers(hf, ours, name, raw):
    check(hf, ours, [IMAGES[name]], raw)


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_committed_image_matches_vllm_decode_then_transformers(hf, ours, path, raw):
    from vllm.multimodal.media import ImageMediaIO

    data = path.read_bytes()
    pixels = np.asarray(decode_pixels(data, MediaPolicy())[0])  # the gateway's decode
    check(hf, ours, [pixels], raw, hf_images=[ImageMediaIO().load_bytes(data).media])


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_several_mixed_images_in_one_request(hf, ours, raw):
    got = check(hf, ours, [IMAGES[n] for n in MIXED], raw)
    # 90x400, 1280x960, 10x12, 333x177, 600x8, each padded to whole 28 px windows.
    assert got.tensors[GRID_KEY].tolist() == [
        [1, 30, 8],
        [1, 70, 92],
        [1, 2, 2],
        [1, 14, 24],
        [1, 2, 44],
    ]


def vision_chunks(images):
    from vllm.multimodal.inputs import VisionChunkImage

    return [VisionChunkImage(type="image", image=i, uuid=None) for i in images]


def vllm_apply(vllm_processor, unexpanded: list[int], images):
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    items = vllm_processor.info.parse_mm_data({"vision_chunk": vision_chunks(images)})
    inputs = ProcessorInputs(unexpanded, items, hf_processor_mm_kwargs={})
    return vllm_processor.apply(inputs, TimingContext(enabled=False))


def test_ids_ranges_and_tensors_equal_vllm_s_own_processor(tiny_ours, vllm_processor):
    """vLLM's whole image path (uint8 pixels: it normalizes this model on device by default),
    with images its 256-patch budget scales down (Pillow's bicubic)."""
    images = [IMAGES[n] for n in MIXED] + [WIDE]
    tokenizer = vllm_processor.info.get_tokenizer()
    unexpanded = tokenizer(chat_text(tokenizer, len(images)), add_special_tokens=False)["input_ids"]
    theirs = vllm_apply(vllm_processor, unexpanded, images)
    got = tiny_ours.process([np.asarray(i) for i in images], tiny_ours.resolve({}), True)
    placeholders = Placeholders("image", tiny_ours.anchor_token_id, got.replacements)
    ids, (ranges,) = expand(unexpanded, [placeholders])
    assert ids == theirs["prompt_token_ids"]
    data = theirs["mm_kwargs"].get_data()
    assert_pixels(got.tensors["pixel_values"], data["pixel_values"].numpy(), raw=True)
    assert np.array_equal(got.tensors[GRID_KEY], data["grid_thws"].numpy())
    assert ranges == [(p.offset, p.length) for p in theirs["mm_placeholders"]["vision_chunk"]]
    assert all(p.is_embed is None for p in theirs["mm_placeholders"]["vision_chunk"])


@pytest.mark.parametrize("raw", [True, False], ids=["uint8", "float"])
def test_scaled_images_are_pillow_s_as_in_vllm_not_torchvision_s(
    hf, tiny_ours, vllm_processor, raw
):
    """Where the budget scales an image down, vLLM's fused processor resizes with Pillow and
    transformers with torchvision: ours equals vLLM's bit for bit, transformers' differs by
    a grey level or two (same grids and counts)."""
    fused = vllm_processor.info.image_processor
    images = [IMAGES["large"], IMAGES["square"], IMAGES["odd"], WIDE]
    scaled = [tiny_ours.size(*np.asarray(i).shape[:2]) for i in images]
    assert all((s.height, s.width) != np.asarray(i).shape[:2] for s, i in zip(scaled, images))
    got = tiny_ours.process([np.asarray(i) for i in images], tiny_ours.resolve({}), raw)
    flags = {"do_rescale": not raw, "do_normalize": not raw}
    want = fused.preprocess(vision_chunks(images), return_tensors="np", **flags)
    assert_pixels(got.tensors["pixel_values"], want["pixel_values"], raw)
    assert np.array_equal(got.tensors[GRID_KEY], want["grid_thws"])
    theirs = hf.image_processor(
        images=images, max_patches=TINY_PATCHES, return_tensors="np", **flags
    )
    assert np.array_equal(theirs["image_grid_thw"], want["grid_thws"])
    diff = np.abs(theirs["pixel_values"].astype(np.float64) - want["pixel_values"]).max()
    level = 1 if raw else 2 / 255  # a grey level, after mean/std 0.5
    assert 0 < diff <= 2 * level + 1e-6


def test_token_counts_equal_vllm_s_and_transformers_grids_on_many_sizes(ours, tiny_ours, hf):
    from vllm.transformers_utils.processors.kimi_k25_vision_fused import navit_resize_image

    rng = np.random.default_rng(0)
    sizes = [
        (h, w)
        for h in (1, 2, 13, 14, 27, 28, 29, 55, 56, 57, 500, 1365, 7167, 7168, 7169, 9000)
        for w in (1, 14, 28, 29, 333, 2048, 7168, 7200, 20000)
    ]
    sizes += [tuple(int(x) for x in rng.integers(1, 12000, 2)) for _ in range(400)]
    for processor in (ours, tiny_ours):
        media = processor.media
        for h, w in sizes:
            vllm = navit_resize_image(w, h, 14, 2, media.in_patch_limit, 512, None)
            size = processor.size(h, w)
            assert (size.height, size.width) == (vllm["new_height"], vllm["new_width"]), (h, w)
            assert size.padded_height == vllm["new_height"] + vllm["pad_height"]
            assert size.padded_width == vllm["new_width"] + vllm["pad_width"]
            assert processor.num_tokens(h, w) == vllm["num_tokens"], (h, w)
    image_processor = hf.image_processor
    for h, w in sizes[:200]:
        patches = image_processor.get_number_of_image_patches(h, w, {})
        assert ours.num_tokens(h, w) * 4 == patches, (h, w)


def test_vllm_s_counter_agrees_on_real_images(tiny_ours, vllm_processor):
    counter = vllm_processor.info.media_tokens_calculator
    for image in [*IMAGES.values(), WIDE, make_image(7300, 20, seed=1)]:
        chunk = {"type": "image", "image": image}
        assert tiny_ours.num_tokens(image.height, image.width) == counter(chunk)


def test_the_gateway_renders_every_layout_as_vllm_does(tiny):
    """The chat prompt around the images (where transformers and vLLM part ways): the gateway
    against vLLM's own /tokenize run offline, for images before, after and between text, and
    without text; transformers' processor on the typed parts agrees only when the images come
    first and some text follows."""
    from transformers import AutoProcessor

    from gateway.render.model_files import ModelFiles
    from gateway.render.renderer import ChatRenderer
    from multimodal.media import decode_source
    from multimodal.registry import processors_for
    from tests.support.family_e2e import data_uri
    from tests.support.vllm_tokenize import VllmTokenization

    vllm = VllmTokenization(tiny, dtype="bfloat16", limit_mm_per_prompt={"vision_chunk": 4})
    hf = AutoProcessor.from_pretrained(tiny)
    files = ModelFiles.load(tiny)
    processors = processors_for(files)
    a, b = make_image(150, 110, seed=21), make_image(64, 40, seed=3)
    layouts = {  # parts -> how transformers' token count compares with vLLM's
        "images then text": ([a, b, "Describe."], 0),
        "text then image": (["Describe.", a], 0),  # vLLM moves the image ahead of the text
        "image between texts": (["Look:", a, "Describe."], 0),  # and joins the texts by "\n"
        "image alone": ([a], 1),  # the template's "\n" after the image, vLLM's none
        "images alone": ([a, b], 1),
    }
    for name, (parts, extra) in layouts.items():
        images = [p for p in parts if not isinstance(p, str)]
        content = [
            {"type": "text", "text": p}
            if isinstance(p, str)
            else {"type": "image_url", "image_url": {"url": data_uri(p)}}
            for p in parts
        ]
        messages = [{"role": "user", "content": content}]
        want = vllm.tokenize({"model": str(tiny), "messages": messages})["tokens"]
        rendered = ChatRenderer(files, processors.placeholders).render(messages)
        loaded = [decode_source(data_uri(i), None, MediaPolicy()) for i in images]
        processor = processors.get("image")
        prepared = prepare([(processor, loaded)], rendered.token_ids, {}, PixelEncoding(True))
        assert prepared.prompt_ids == want, name
        typed = [
            {"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in parts
        ]
        text = hf.apply_chat_template(
            [{"role": "user", "content": typed}], add_generation_prompt=True, tokenize=False
        )
        theirs = hf(text=[text], images=images, max_patches=TINY_PATCHES)["input_ids"][0]
        assert len(theirs) == len(want) + extra, name
        assert (list(theirs) == want) == (name == "images then text"), name


def test_the_pipeline_lays_out_the_wire(tiny_ours):
    images = [np.asarray(IMAGES["square"]), np.asarray(IMAGES["wide"])]
    items = [SimpleNamespace(data=b"%d" % i, pixels=p) for i, p in enumerate(images)]
    pad = tiny_ours.anchor_token_id
    prepared = prepare([(tiny_ours, items)], [7, pad, 8, pad, 9], {}, PixelEncoding(raw=True))
    (mm,) = prepared.mm_inputs
    assert list(mm.flat_keys.items()) == [("pixel_values", SIZES_KEY)]
    assert list(mm.batched_keys) == [GRID_KEY, SIZES_KEY]
    assert list(mm.keep_on_cpu_keys) == [GRID_KEY]
    assert not mm.HasField("im_token_id")  # every token of a run is an embedding
    assert mm.pixel_values.dtype == "uint8" and list(mm.pixel_values.shape)[1:] == [3, 14, 14]
    counts = [tiny_ours.num_tokens(*i.shape[:2]) for i in images]
    assert [(p.offset, p.length) for p in mm.mm_placeholders] == [
        (1, counts[0]),
        (2 + counts[0], counts[1]),
    ]


def test_native_and_numpy_layouts_agree(tiny_ours, monkeypatch):
    from multimodal.processors import transforms

    images = [np.asarray(IMAGES[n]) for n in MIXED] + [np.asarray(WIDE)]
    outputs = {}
    for native in (True, False):
        monkeypatch.setattr(transforms.native, "AVAILABLE", native and transforms.native.AVAILABLE)
        for raw in (True, False):
            outputs[native, raw] = tiny_ours.process(images, tiny_ours.resolve({}), raw)
    for raw in (True, False):
        a, b = outputs[True, raw].tensors, outputs[False, raw].tensors
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_navit_size_by_hand():
    media = KimiMedia(14, 2, 16384, 512, (0.5,) * 3, (0.5,) * 3)
    assert navit_size(960, 1280, media) == NavitSize(960, 1280, 980, 1288)  # kept, padded
    assert navit_size(12, 10, media) == NavitSize(12, 10, 28, 28)  # one 2x2 window
    # 428 x 357 patches: scale sqrt(16384 / 152796) = 0.32746, int(6000 s) = 1964, int(5000 s)
    # = 1637, padded to 71 x 59 windows of 28 px: 4189 tokens.
    assert navit_size(6000, 5000, media) == NavitSize(1964, 1637, 1988, 1652)


def test_no_per_request_options(ours):
    assert ours.resolve({}) is ours.media  # the model's limits, in every item's hash
    for options in ({"max_patches": 100}, {"size": {"max_height": 64}}, {"do_normalize": False}):
        with pytest.raises(OptionError, match="unsupported mm_processor_kwargs.*accepted: none"):
            ours.resolve(options)


def test_the_processor_reads_the_released_config(ours, hf, released):
    assert type(ours) is KimiK25Processor
    assert ours.anchor_token_id == hf.tokenizer.convert_tokens_to_ids(MEDIA_PAD)
    assert ours.media == KimiMedia(14, 2, 16384, 512, (0.5,) * 3, (0.5,) * 3)
    assert (
        ours.placeholder_text == "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>"
    )


def _files(config, pre, vocab=None):
    return SimpleNamespace(
        config=config, preprocessor=pre, video_preprocessor={}, vocab=vocab or {}, tokenizer=None
    )


def test_families_are_told_apart():
    from multimodal.registry import FAMILIES

    kimi = {"model_type": "kimi_k25"}
    media = {"media_proc_cfg": {"patch_size": 14}}
    for config, pre, expected in [
        (kimi, media, True),
        (kimi, {**media, "image_processor_type": "Kimi_K25ImageProcessor"}, True),
        (kimi, {"image_processor_type": "Qwen2VLImageProcessor"}, False),
        ({"model_type": "kimi_vl"}, media, False),
        ({"model_type": "kimi_k3"}, media, False),
    ]:
        files = _files(config, pre)
        assert KimiK25Processor.matches(files) == expected
        if expected:
            others = [f for f in FAMILIES if f is not KimiK25Processor and f.matches(files)]
            assert others == []


@pytest.mark.parametrize(
    "pre, config, message",
    [
        ({}, {}, "media_proc_cfg"),
        ({"media_proc_cfg": {"patch_size": 14}}, {}, "no 'merge_kernel_size'"),
        (
            {"media_proc_cfg": {"patch_size": 14, "fixed_output_tokens": 64}},
            {},
            "fixed_output_tokens",
        ),
        (None, {"vision_config": {"merge_kernel_size": [4, 4]}}, "merge_kernel_size"),
    ],
)
def test_configs_vllm_could_not_serve_are_refused(released, pre, config, message):
    from gateway.render.model_files import ModelFiles

    files = ModelFiles.load(released)
    pre = files.preprocessor if pre is None else pre
    with pytest.raises(ModelConfigError, match=message):
        KimiK25Processor.from_files(_files({"model_type": "kimi_k25", **config}, pre, files.vocab))


def test_the_media_pad_id_is_the_tokenizer_s(released):
    from gateway.render.model_files import ModelFiles

    files = ModelFiles.load(released)
    config = {**files.config, "image_token_id": 5}  # vLLM prefers the tokenizer's, as here
    processor = KimiK25Processor.from_files(_files(config, files.preprocessor, files.vocab))
    assert processor.anchor_token_id == files.vocab[MEDIA_PAD] != 5
    without = KimiK25Processor.from_files(_files(config, files.preprocessor, {}))
    assert without.anchor_token_id == 5


def test_pillow_resize_is_vllm_s(tiny_ours):
    """The one step not shared with the other families: Pillow's bicubic on the RGB image."""
    from vllm.transformers_utils.processors.kimi_k25_vision_fused import (
        KimiK25FusedVisionProcessor,
    )

    from multimodal.processors.kimi_k25 import _resized

    for image in (IMAGES["large"], IMAGES["odd"], WIDE):
        size = tiny_ours.size(image.height, image.width)
        want = KimiK25FusedVisionProcessor.resize_image(image, size.width, size.height)
        assert np.array_equal(_resized(np.asarray(image), size), want)


def test_the_worker_keys_the_items_as_vision_chunks_as_vllm_does(tiny, tiny_ours, vllm_processor):
    """The wire (modality IMAGE) decoded by the worker for a `use_unified_vision_chunk` model:
    the items under "vision_chunk" with vLLM's own per-item tensors, the slots counted from
    grid_thws; a placeholder one short and a grid the tower cannot merge are refused."""
    import torch
    from transformers import AutoConfig

    from engine_server.errors import InvalidRequest
    from engine_server.mm_inputs import PixelContract, build_mm_prompt
    from engine_server.mm_slots import EmbeddingSlots
    from engine_server.model_info import engine_modality, item_limits
    from multimodal.wire import multimodal_inputs

    config = AutoConfig.from_pretrained(tiny)
    model_config = SimpleNamespace(
        hf_config=config,
        is_multimodal_model=True,
        get_multimodal_config=lambda: SimpleNamespace(
            get_limit_per_prompt=lambda m: {"vision_chunk": 3}.get(m, 999)
        ),
    )
    assert [engine_modality(model_config, m) for m in ("image", "video", "audio")] == [
        "vision_chunk",
        "vision_chunk",
        "audio",
    ]
    # the vision_chunk limit, by wire name (audio: the fake config's 999 for any other key)
    assert item_limits(model_config) == "image=3,video=3,audio=999"
    engine = SimpleNamespace(
        model_config=model_config, renderer=SimpleNamespace(mm_processor=None), tokenizer=None
    )
    slots = EmbeddingSlots(engine)

    images = [IMAGES["odd"], WIDE, IMAGES["tiny"]]
    got = tiny_ours.process([np.asarray(i) for i in images], tiny_ours.resolve({}), True)
    ids, ranges = [1], []
    for tokens in got.replacements:
        ranges.append((len(ids), len(tokens)))
        ids += [*tokens, 2]
    mm = multimodal_inputs(got, ranges, ["a", "b", "c"], None, "image")

    def build(message):
        contract = PixelContract(True, torch.bfloat16)
        return build_mm_prompt(
            ids, [message], contract, None, slots.check, partial(engine_modality, model_config)
        )

    prompt = build(mm)
    assert set(prompt["mm_kwargs"]) == set(prompt["mm_placeholders"]) == {"vision_chunk"}
    tokenizer = vllm_processor.info.get_tokenizer()
    text = chat_text(tokenizer, len(images))
    theirs = vllm_apply(
        vllm_processor, tokenizer(text, add_special_tokens=False)["input_ids"], images
    )
    for item, want in zip(prompt["mm_kwargs"]["vision_chunk"], theirs["mm_kwargs"]["vision_chunk"]):
        assert set(item) - {SIZES_KEY} == set(want)
        for key in want:
            assert torch.equal(item[key].data, want[key].data), key
    assert [p.get_num_embeds() for p in prompt["mm_placeholders"]["vision_chunk"]] == [
        len(t) for t in got.replacements
    ]

    short = type(mm)()
    short.CopyFrom(mm)
    short.mm_placeholders[1].length -= 1
    with pytest.raises(InvalidRequest, match="vision_chunk item 1 has .* embedding positions"):
        build(short)
    odd = type(mm)()
    odd.CopyFrom(mm)
    grid = got.tensors[GRID_KEY].copy()
    _, h, w = grid[0]
    assert (h * w) % 3 == 0
    grid[0, 1:] = [3, h * w // 3]  # as many patches, in 3 rows: the 2x2 merge cannot pair them
    odd.model_specific_tensors[GRID_KEY].inline = grid.tobytes()
    with pytest.raises(InvalidRequest, match="multiples of"):
        build(odd)


def test_normalization_is_vllm_s_table_to_the_bit(vllm_processor, tiny_ours):
    table = vllm_processor.info.image_processor.normalize_lut  # [256, 3] float32
    values = np.broadcast_to(np.arange(256, dtype=np.uint8)[None, :, None], (3, 256, 1))
    ours = normalize(
        np.ascontiguousarray(values), tiny_ours.media, np.empty((3, 256, 1), np.float32)
    )
    assert np.array_equal(ours[:, :, 0], table.T)
