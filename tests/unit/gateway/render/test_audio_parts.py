"""`audio_url` and `input_audio` content parts: their items, what the template sees for them,
and the media_refs a worker gets (gateway.render.messages, gateway.render.worker_media); the
rendered prompt equal to vLLM's own chat renderer's on the tiny Qwen2-Audio."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.errors import ChatRequestError
from gateway.render.messages import MediaItem, to_conversation
from gateway.render.worker_media import fallback_placeholders, media_refs
from multimodal.errors import MediaError
from multimodal.media import MediaPolicy
from protos import common_pb2
from tests.support.audio_refs import require

QWEN2_AUDIO = ("Qwen2AudioForConditionalGeneration",)
AUDIO_TEXT = "Audio {i}: <|audio_bos|><|AUDIO|><|audio_eos|>"
IMAGE_TEXT = "<|vision_start|><|image_pad|><|vision_end|>"


def numbered(i: int) -> str:
    return AUDIO_TEXT.format(i=i)


PLACEHOLDERS = {"audio": numbered, "image": IMAGE_TEXT}


def parse(content, fmt="string", placeholders=PLACEHOLDERS, interleave=False):
    messages = [{"role": "user", "content": content}]
    conversation, media = to_conversation(messages, "", fmt, placeholders, interleave)
    return conversation[0]["content"], media


def input_audio(data="UklGRg==", audio_format="wav", **extra):
    return {"type": "input_audio", "input_audio": {"data": data, "format": audio_format}, **extra}


def audio_url(url="data:audio/wav;base64,UklGRg=="):
    return {"type": "audio_url", "audio_url": {"url": url}}


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def test_input_audio_becomes_the_data_url_vllm_builds_from_it():
    # vLLM: f"data:audio/{format};base64,{data}", the format unchecked (its loader sniffs)
    _, media = parse([input_audio("QUJD", "flac"), input_audio("REVG", "")])
    assert [m.url for m in media] == ["data:audio/flac;base64,QUJD", "data:audio/;base64,REVG"]
    assert [m.modality for m in media] == ["audio", "audio"]
    assert media[1].part == "messages[0].content[1]"


def test_audio_url_takes_an_object_or_a_string_and_parts_without_a_type():
    _, media = parse(
        [
            audio_url("https://example.com/a.mp3"),
            {"type": "audio_url", "audio_url": "https://example.com/b.ogg"},
            {"audio_url": {"url": "https://example.com/c.wav"}},
            {"input_audio": {"data": "QUJD", "format": "mp3"}},
        ]
    )
    assert [m.url for m in media] == [
        "https://example.com/a.mp3",
        "https://example.com/b.ogg",
        "https://example.com/c.wav",
        "data:audio/mp3;base64,QUJD",
    ]


def test_string_format_numbers_each_audio_and_keeps_vllm_s_grouping():
    content, _ = parse([text("Hi"), input_audio(), audio_url(), text("there")])
    assert content == "\n".join([numbered(1), numbered(2), "Hi", "there"])
    # the numbering runs over the whole conversation, as vLLM's item tracker counts
    messages = [
        {"role": "user", "content": [input_audio()]},
        {"role": "user", "content": [input_audio(), text("x")]},
    ]
    conversation, _ = to_conversation(messages, "", "string", PLACEHOLDERS)
    assert [m["content"] for m in conversation] == [numbered(1), f"{numbered(2)}\nx"]


def test_openai_format_sees_an_audio_part_with_its_extra_keys():
    content, _ = parse([input_audio(note="kept"), audio_url()], fmt="openai")
    assert content == [{"type": "audio", "note": "kept"}, {"type": "audio"}]


def test_interleaved_markers_take_the_next_audio_placeholder():
    content, _ = parse([text("a"), input_audio(), text("b"), audio_url()], interleave=True)
    assert content == "\n".join(["a", numbered(1), "b", numbered(2)])


def test_a_model_without_audio_refuses_the_part_by_name():
    with pytest.raises(ChatRequestError, match=r"content\[1\]: this model does not accept audio "):
        parse([text("x"), input_audio()], placeholders={"image": IMAGE_TEXT})
    with pytest.raises(ChatRequestError, match=r"accepts text, image_url\)"):
        parse([{"type": "input_audio2"}], placeholders={"image": IMAGE_TEXT})


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"type": "input_audio", "input_audio": "QUJD"}, r"input_audio must be an object"),
        ({"type": "input_audio", "input_audio": {"format": "wav"}}, r"input_audio.data is req"),
        (input_audio(""), r"input_audio.data is required"),
        (input_audio("QUJD", 3), r"input_audio.format must be a string"),
        ({"type": "audio_url", "audio_url": {}}, r"audio_url.url is required"),
    ],
)
def test_malformed_audio_parts_are_refused(part, message):
    with pytest.raises(ChatRequestError, match=message):
        parse([part])


def test_fallback_placeholders_know_audio_where_vllm_does():
    qwen = fallback_placeholders(QWEN2_AUDIO)
    assert qwen["audio"](2) == numbered(2)
    assert "audio" not in fallback_placeholders(("Qwen2VLForConditionalGeneration",))


def wav(seconds: float = 0.3, rate: int = 16000, channels: int = 1) -> bytes:
    soundfile = require("soundfile")
    samples = np.random.default_rng(1).standard_normal((round(seconds * rate), channels)) * 0.1
    buffer = io.BytesIO()
    soundfile.write(buffer, samples.astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def test_audio_goes_to_the_worker_checked_in_prompt_order():
    raw = wav()
    items = [
        MediaItem("audio", f"data:audio/mp3;base64,{b64(raw)}"),  # declared mp3, is a WAV
        MediaItem("image", f"data:image/png;base64,{b64(_png())}"),
        MediaItem("audio", f"data:audio/wav;base64,{b64(wav(0.2, 44100, 2))}"),
    ]
    out = asyncio.run(media_refs(items, MediaPolicy(), None))
    assert [r.modality for r in out.items] == [common_pb2.AUDIO, common_pb2.IMAGE, common_pb2.AUDIO]
    assert out.items[0].url == f"data:audio/wav;base64,{b64(raw)}"


def test_a_bad_clip_is_named_by_its_index_among_the_audio():
    items = [
        MediaItem("image", f"data:image/png;base64,{b64(_png())}"),
        MediaItem("audio", f"data:audio/wav;base64,{b64(wav())}"),
        MediaItem("audio", f"data:audio/wav;base64,{b64(b'nothing' * 10)}"),
    ]
    with pytest.raises(MediaError) as refused:
        asyncio.run(media_refs(items, MediaPolicy(), None))
    assert refused.value.message.startswith("invalid audio: audio 1: not a supported audio")
    with pytest.raises(MediaError, match="audio 0: the audio has 2 channels, above the 1"):
        asyncio.run(media_refs([MediaItem("audio", f"data:;base64,{b64(wav(0.1, channels=2))}")],
                               MediaPolicy(max_audio_channels=1), None))  # fmt: skip


def test_an_http_clip_is_downloaded_under_the_audio_byte_limit():
    from tests.support.http_files import serve_bytes

    raw = wav()
    small = MediaPolicy(allowed_networks=("127.0.0.0/8",), max_audio_bytes=len(raw) - 1)
    with serve_bytes(raw, "audio/wav") as base:
        item = [MediaItem("audio", f"{base}/a.wav")]
        with pytest.raises(MediaError, match="audio 0: audio exceeds the"):
            asyncio.run(media_refs(item, small, None))
        # the image byte limit does not apply to audio
        policy = MediaPolicy(allowed_networks=("127.0.0.0/8",), max_bytes=len(raw) - 1)
        out = asyncio.run(media_refs(item, policy, None))
    assert out.items[0].url == f"data:audio/wav;base64,{b64(raw)}"


def _png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), (9, 9, 9)).save(buffer, format="PNG")
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# The rendered prompt against vLLM's own chat renderer (OnlineRenderer.render_chat, stopped
# before the placeholders are expanded), on the tiny Qwen2-Audio: its template takes "openai"
# parts; a string-only template gets vLLM's numbered placeholder.

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def qwen2_audio_model(tmp_path_factory) -> Path:
    from tests.support.qwen2_audio_models import build_model

    return build_model(tmp_path_factory.mktemp("qwen2-audio") / "model")


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def vllm_render(model: Path, loop, messages, chat_template=None, **options) -> tuple[str, list]:
    from vllm.config import ModelConfig, VllmConfig
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers import renderer_from_config
    from vllm.renderers.online_renderer import OnlineRenderer

    config = ModelConfig(model=str(model), max_model_len=2048, **options)
    renderer = renderer_from_config(VllmConfig(model_config=config))

    async def tokens_only(prompt: Any, *args: Any, **kwargs: Any) -> Any:
        return prompt

    renderer.process_for_engine_async = tokens_only
    online = OnlineRenderer(
        config,
        renderer,
        request_logger=None,
        chat_template=chat_template,
        chat_template_content_format="auto",
    )
    request = ChatCompletionRequest(model=str(model), messages=messages)
    result = loop.run_until_complete(online.render_chat(request))
    assert isinstance(result, tuple), f"vLLM refused the request: {result}"
    _, [engine_input] = result
    return engine_input["prompt"], list(engine_input["prompt_token_ids"])


def gateway_render(model: Path, messages, **options) -> tuple[str, list]:
    """Rendered as `mmgate serve` renders for a model whose audio the worker preprocesses."""
    from gateway.render.model_files import ModelFiles
    from gateway.render.renderer import ChatRenderer
    from multimodal.registry import processors_for

    files = ModelFiles.load(model)
    placeholders = {
        **fallback_placeholders(files.config["architectures"]),
        **processors_for(files).placeholders,
    }
    rendered = ChatRenderer(files, placeholders, **options).render(
        messages, add_generation_prompt=True, continue_final_message=False
    )
    return rendered.prompt, rendered.token_ids


def conversations() -> list[list[dict]]:
    clip, stereo = b64(wav(0.3)), b64(wav(0.2, 44100, 2))
    return [
        [{"role": "user", "content": [input_audio(clip), text("What is this?")]}],
        [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    text("Compare"),
                    input_audio(stereo, "mp3"),  # a WAV declared as mp3: vLLM sniffs
                    audio_url(f"data:audio/wav;base64,{clip}"),
                ],
            },
            {"role": "assistant", "content": "Two clips."},
            {"role": "user", "content": [audio_url(f"data:audio/wav;base64,{clip}")]},
        ],
    ]


@pytest.mark.parametrize("template", [None, CHATML_TEMPLATE], ids=["openai", "string"])
def test_audio_prompts_render_as_vllm_renders_them(qwen2_audio_model, loop, template):
    for messages in conversations():
        ours = gateway_render(qwen2_audio_model, messages, chat_template=template)
        assert ours == vllm_render(qwen2_audio_model, loop, messages, chat_template=template)
    assert ours[0].count("<|AUDIO|>") == 3
    if template is not None:
        assert "Audio 3: <|audio_bos|>" in ours[0]


def test_interleaved_audio_renders_as_vllm_renders_it(qwen2_audio_model, loop):
    clip = b64(wav(0.3))
    messages = [{"role": "user", "content": [text("a"), input_audio(clip), text("b")]}]
    ours = gateway_render(
        qwen2_audio_model, messages, chat_template=CHATML_TEMPLATE, interleave_mm_strings=True
    )
    vllm = vllm_render(
        qwen2_audio_model, loop, messages, CHATML_TEMPLATE, interleave_mm_strings=True
    )
    assert ours == vllm
    assert f"a\n{numbered(1)}\nb" in ours[0]
