"""The preprocessed-media cache (`multimodal.media_cache`) and `prepare()` through it: bounded
in bytes, least recently used out first, safe from several threads; a hit gives the tensors,
prompt and hashes a fresh processing gives, without decoding the item; other processor options
or another pixel encoding are other keys."""

from __future__ import annotations

import base64
import io
import threading

import numpy as np
import pytest
from PIL import Image

import multimodal.media as media
from multimodal.media_cache import GIB, MediaCache
from multimodal.pipeline import PixelEncoding, prepare
from multimodal.policy import MediaPolicy
from multimodal.processors.items import SHARE_OVERHEAD_BYTES, ItemShare
from tests.support import load_processor

RAW = PixelEncoding(raw=True)
FLOATS = PixelEncoding(raw=False)


def share(payload_bytes: int) -> ItemShare:
    """A share of exactly `payload_bytes` + the counted overhead."""
    return ItemShare(
        {"pixel_values": np.zeros(payload_bytes, np.uint8)}, {"pixel_values": "flat"}, []
    )


UNIT = share(1000).nbytes  # 1000 + SHARE_OVERHEAD_BYTES


def test_a_share_costs_its_tensors_and_a_counted_overhead():
    s = ItemShare({"a": np.zeros((10, 10), np.float32)}, {"a": "flat"}, [7, 7, 7])
    assert s.nbytes == 400 + 3 * 8 + SHARE_OVERHEAD_BYTES


def test_the_bound_holds_and_the_least_recently_used_goes_first():
    cache = MediaCache(3 * UNIT)
    for key in "abc":
        assert cache.put(key, share(1000))
    assert cache.get("a") is not None  # a is now the most recently used: b is the oldest
    cache.put("d", share(1000))
    assert "b" not in cache and all(k in cache for k in "acd")
    cache.put("e", share(1000))
    assert "c" not in cache and all(k in cache for k in "ade")
    stats = cache.stats()
    assert (stats.items, stats.bytes, stats.evictions) == (3, 3 * UNIT, 2)
    assert (stats.hits, stats.misses) == (1, 0)
    assert cache.get("b") is None and cache.stats().misses == 1
    # one larger item pushes out as many as it needs, oldest first
    cache.put("big", share(2 * UNIT - SHARE_OVERHEAD_BYTES))
    assert [k in cache for k in "ade"] == [False, False, True] and "big" in cache
    assert cache.stats().bytes == 3 * UNIT <= cache.capacity


def test_an_item_larger_than_the_cache_is_served_uncached():
    cache = MediaCache(2 * UNIT)
    cache.put("a", share(1000))
    assert not cache.put("huge", share(3 * UNIT))
    assert "huge" not in cache and "a" in cache and cache.stats().evictions == 0


def test_putting_a_key_again_replaces_it_without_counting_it_twice():
    cache = MediaCache(3 * UNIT)
    cache.put("a", share(1000))
    cache.put("a", share(1000))
    assert cache.stats().bytes == UNIT and cache.stats().items == 1


def test_sizes_in_gib_and_zero_disables():
    assert MediaCache.from_gib(0) is None
    assert MediaCache.from_gib(0.5).capacity == GIB // 2
    with pytest.raises(ValueError):
        MediaCache.from_gib(-1)


def test_several_threads_keep_the_bound_and_the_counts():
    cache = MediaCache(20 * UNIT)
    rounds, threads = 2000, 8
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(rounds):
                key = f"k{rng.integers(0, 60)}"
                if cache.get(key) is None:
                    cache.put(key, share(int(rng.integers(1, 3)) * 1000))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert not errors
    stats = cache.stats()
    assert stats.hits + stats.misses == rounds * threads
    assert stats.hits > 0 and stats.evictions > 0
    held = sum(cache._items[k].nbytes for k in cache._items)  # noqa: SLF001 - the invariant
    assert stats.bytes == held <= cache.capacity
    assert stats.items == len(cache._items)  # noqa: SLF001


# ---- prepare() through the cache, with a real processor (tiny Qwen2-VL) --------------------


@pytest.fixture(scope="module")
def processor(vision_model):
    return load_processor(vision_model)


def _png(seed: int, height: int, width: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


IMAGES = [_png(1, 60, 90), _png(2, 120, 64), _png(3, 33, 47)]


def _prompt(processor, count: int) -> list[int]:
    return [1, 2] + [processor.anchor_token_id, 3] * count


def _prepared(processor, images, cache, kwargs=None, encoding=RAW):
    items = media.pending_sources([_uri(d) for d in images], [None] * len(images), MediaPolicy())
    return prepare(
        [(processor, items)], _prompt(processor, len(images)), kwargs or {}, encoding, cache=cache
    )


def assert_same(have, want) -> None:
    assert have.prompt_ids == want.prompt_ids
    assert have.float_dtype == want.float_dtype
    for a, b in zip(have.parts, want.parts, strict=True):
        assert (a.ranges, a.hashes) == (b.ranges, b.hashes)
        assert list(a.processed.tensors) == list(b.processed.tensors)
        for key, tensor in b.processed.tensors.items():
            got = a.processed.tensors[key]
            assert (got.dtype, got.shape, got.tobytes()) == (
                tensor.dtype,
                tensor.shape,
                tensor.tobytes(),
            )
        assert a.processed.replacements == b.processed.replacements
    assert [m.SerializeToString() for m in have.mm_inputs] == [
        m.SerializeToString() for m in want.mm_inputs
    ]


@pytest.mark.parametrize("encoding", [RAW, FLOATS], ids=["uint8", "float32"])
def test_hits_give_what_processing_gives_without_decoding(processor, encoding, monkeypatch):
    cache = MediaCache(GIB)
    fresh = _prepared(processor, IMAGES, None, encoding=encoding)
    reordered = _prepared(processor, [IMAGES[2], IMAGES[0]], None, encoding=encoding)
    first = _prepared(processor, IMAGES[:2], cache, encoding=encoding)  # the earlier turn
    assert_same(first, _prepared(processor, IMAGES[:2], None, encoding=encoding))
    assert (cache.stats().hits, cache.stats().misses, cache.stats().items) == (0, 2, 2)

    decoded = []
    real = media._decoded
    monkeypatch.setattr(media, "_decoded", lambda *a: decoded.append(a) or real(*a))
    later = _prepared(processor, IMAGES, cache, encoding=encoding)  # 2 cached, 1 new
    assert_same(later, fresh)
    assert len(decoded) == 1  # only the new image was decoded
    assert (cache.stats().hits, cache.stats().misses) == (2, 3)
    again = _prepared(processor, [IMAGES[2], IMAGES[0]], cache, encoding=encoding)
    assert_same(again, reordered)
    assert len(decoded) == 1 and cache.stats().hits == 4


def test_a_repeated_item_is_processed_once(processor):
    cache = MediaCache(GIB)
    images = [IMAGES[0], IMAGES[1], IMAGES[0]]
    assert_same(_prepared(processor, images, cache), _prepared(processor, images, None))
    # (the repeat is neither a hit nor a miss: it never reaches the cache)
    assert (cache.stats().misses, cache.stats().items) == (2, 2)


def test_other_options_or_another_pixel_encoding_miss(processor):
    cache = MediaCache(GIB)
    _prepared(processor, IMAGES[:1], cache)
    small = {"max_pixels": 56 * 56}
    resized = _prepared(processor, IMAGES[:1], cache, kwargs=small)
    assert cache.stats().hits == 0 and cache.stats().misses == 2
    assert_same(resized, _prepared(processor, IMAGES[:1], None, kwargs=small))
    floats = _prepared(processor, IMAGES[:1], cache, encoding=FLOATS)
    assert cache.stats().hits == 0 and cache.stats().misses == 3
    assert floats.parts[0].processed.tensors["pixel_values"].dtype == np.float32
    _prepared(processor, IMAGES[:1], cache, kwargs=small)
    assert cache.stats().hits == 1  # and each key is found again


def test_a_bad_image_fails_with_its_index_when_it_is_decoded(processor):
    cache = MediaCache(GIB)
    bad = b"\x89PNG\r\n\x1a\n not a png"
    with pytest.raises(media.MediaError) as failed:
        _prepared(processor, [IMAGES[0], bad], cache)
    assert failed.value.index == 1


def test_metrics_read_the_current_cache():
    from gateway.observability.metrics import GatewayMetrics, MediaCacheCollector

    metrics, current = GatewayMetrics(), [None]
    metrics.watch(MediaCacheCollector(lambda: current[0]))
    text = metrics.exposition().decode()
    assert "mmgate_mm_cache_hits_total 0.0" in text and "mmgate_mm_cache_bytes 0.0" in text
    cache = MediaCache(2 * UNIT)
    current[0] = cache
    for key in "abc":
        cache.get(key)
        cache.put(key, share(1000))
    cache.get("c")
    lines = set(metrics.exposition().decode().splitlines())
    assert {
        "mmgate_mm_cache_hits_total 1.0",
        "mmgate_mm_cache_misses_total 3.0",
        "mmgate_mm_cache_evictions_total 1.0",
        f"mmgate_mm_cache_bytes {2 * UNIT}.0",
    } <= lines


# ---- videos: read first, decoded only on a miss ----------------------------------------------


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> list[str]:
    from tests.support.video_e2e import data_uri, jpeg_frames, make_clip

    tmp = tmp_path_factory.mktemp("clips")
    clip = make_clip(tmp, "a.avi", 12, (64, 48), 4.0, "MJPG", 1)
    return [data_uri(clip, "video/x-msvideo"), jpeg_frames(4, (56, 40), seed=2)]


def _video_prepared(processor, uris, cache, lazy: bool):
    from multimodal.pipeline import decode_items

    settings = processor.resolve({})
    items = decode_items(processor, uris, [None] * len(uris), settings, MediaPolicy(), lazy=lazy)
    ids = [1] + [processor.anchor_token_id, 2] * len(uris)
    return prepare([(processor, items)], ids, {}, RAW, cache=cache)


def test_a_cached_video_is_not_decoded_again(vision_model, videos, monkeypatch):
    from multimodal.video import VideoSource

    processor = load_processor(vision_model, "video")
    fresh = _video_prepared(processor, videos, None, lazy=False)
    reversed_fresh = _video_prepared(processor, videos[::-1], None, lazy=False)
    loads = []
    real = VideoSource.load
    monkeypatch.setattr(VideoSource, "load", lambda self, *a: loads.append(self) or real(self, *a))
    cache = MediaCache(GIB)
    assert_same(_video_prepared(processor, videos, cache, lazy=True), fresh)
    assert len(loads) == 2 and cache.stats().misses == 2
    assert_same(_video_prepared(processor, videos[::-1], cache, lazy=True), reversed_fresh)
    assert len(loads) == 2 and cache.stats().hits == 2  # neither decoded again


def test_a_bad_video_fails_with_its_index_when_it_is_decoded(vision_model, videos):
    processor = load_processor(vision_model, "video")
    bad = "data:video/mp4;base64," + base64.b64encode(b"\0\0\0\x18ftypmp42 not a clip").decode()
    with pytest.raises(media.MediaError) as failed:
        _video_prepared(processor, [videos[0], bad], MediaCache(GIB), lazy=True)
    assert (failed.value.index, failed.value.kind) == (1, "video")
