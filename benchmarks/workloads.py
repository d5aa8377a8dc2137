"""Request bodies for the load generator, one per (client, sequence number), deterministic.

- `text`: one short prompt, the same every request.
- `image`: one 640x480 JPEG, the same every request.
- `chat`: every request different: one of several system prompts (or none), 0-3 earlier
  turns, and a last user message of mixed length (mostly short, some of a few thousand
  tokens), drawn from a seeded generator keyed by the request, so a rerun sends the same.
- `photo` / `photo-large`: a different 640x480 / 1280x960 JPEG every request.
- `turns`: 3-turn conversations, each turn resending the conversation's two images (640x480
  and 1280x960) with its history; every conversation has images of its own, so a gateway's
  cache can only help from its second turn on.

A distinct JPEG is the base image with a few luminance and chrominance quantization table
entries raised: a valid JPEG of the same size whose bytes and decoded pixels differ, made in
microseconds (encoding one would cost the load generator milliseconds per request).
"""

from __future__ import annotations

import base64
import io
import random
from collections.abc import Callable
from functools import cache

SMALL, LARGE = (640, 480), (1280, 960)
TEXT_PROMPT = "Write a short poem about the sea, the wind and the boats in the harbour."
IMAGE_PROMPT = "Describe this image."
KINDS = ("text", "image", "chat", "photo", "photo-large", "turns")
FIXED_KINDS = ("text", "image")  # the same body every request
TURNS = 3
SYSTEM_PROMPTS = (
    None,
    "You are a helpful assistant.",
    "You are a terse assistant. Answer in one sentence and never use lists.",
    "You are a careful technical writer. Explain every step, define each term you use, and "
    "say which assumptions your answer rests on before you give it.",
    "You are a travel agent for a small company that runs boat trips along the coast. Be "
    "friendly, mention the weather, and always suggest one of the morning departures.",
)
WORDS = (  # noqa: SIM905 - a sentence reads better than 57 quoted words
    "sea wind boat harbour tide sail rope anchor gull wave shore cliff light house storm "
    "calm morning evening island current fish net dock keel mast deck chart compass north "
    "south river stone sand shell salt cloud rain fog bell crew captain voyage coast bay "
    "reef lantern map signal engine hull port starboard bow stern ferry pier beacon"
).split()
ASSISTANT_REPLIES = (
    "The first image is smaller and warmer; the second is larger and has more detail.",
    "Both use the same gradient, from dark in the top left to light in the bottom right.",
)
FOLLOW_UPS = ("What about the colours?", "Which one would you print, and why?")


# ---- images ----


@cache
def synthetic_jpeg(size: tuple[int, int] = SMALL, quality: int = 90) -> bytes:
    """A deterministic photo-like JPEG: gradients plus mild noise."""
    import numpy as np
    from PIL import Image

    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (width + height)], -1)
    noise = np.random.default_rng(0).normal(0, 6, rgb.shape)
    pixels = np.clip(rgb + noise, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


@cache
def _quantization_entries(jpeg: bytes) -> tuple[int, ...]:
    """Offsets of the low-frequency AC entries (zigzag 1-6) of every 8-bit quantization
    table: changing them changes how every block decodes, but only a little."""
    offsets: list[int] = []
    at = 2  # after SOI
    while at + 4 <= len(jpeg) and jpeg[at] == 0xFF:
        marker, length = jpeg[at + 1], int.from_bytes(jpeg[at + 2 : at + 4], "big")
        if marker == 0xDA:  # start of scan: no more tables before the entropy-coded data
            break
        if marker == 0xDB:
            table = at + 4
            while table < at + 2 + length:
                precision = jpeg[table] >> 4
                if precision == 0:
                    offsets += [table + 1 + k for k in range(1, 7)]
                table += 1 + 64 * (precision + 1)
        at += 2 + length
    if not offsets:
        raise ValueError("no 8-bit quantization table in the JPEG")
    return tuple(offsets)


def distinct_jpeg(size: tuple[int, int], index: int) -> bytes:
    """The base JPEG of `size` made different for each index (up to 4 ** entries of them)."""
    base = synthetic_jpeg(size)
    offsets = _quantization_entries(base)
    if index >= 4 ** len(offsets):
        raise ValueError(f"only {4 ** len(offsets)} distinct images of this size")
    data = bytearray(base)
    for offset in offsets:
        index, step = divmod(index, 4)
        data[offset] = min(255, data[offset] + step)
    return bytes(data)


def data_uri(jpeg: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()


def image_part(jpeg: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": data_uri(jpeg)}}


# ---- text ----


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choices(WORDS, k=count))


def _user_length(rng: random.Random) -> int:
    """Words in the last user message: half short, a third medium, the rest long."""
    draw = rng.random()
    if draw < 0.5:
        return rng.randint(5, 40)
    if draw < 0.85:
        return rng.randint(80, 300)
    return rng.randint(400, 1000)


def varied_messages(seed: int) -> list[dict]:
    rng = random.Random(seed)
    messages: list[dict] = []
    system = rng.choice(SYSTEM_PROMPTS)
    if system is not None:
        messages.append({"role": "system", "content": system})
    for _ in range(rng.choice((0, 0, 1, 2, 3))):
        messages.append({"role": "user", "content": _words(rng, rng.randint(5, 60))})
        messages.append({"role": "assistant", "content": _words(rng, rng.randint(10, 80))})
    messages.append({"role": "user", "content": f"{seed}: {_words(rng, _user_length(rng))}"})
    return messages


def turn_messages(conversation: int, turn: int) -> list[dict]:
    """Turn `turn` (0-based) of a conversation: the two images in its first message."""
    images = [image_part(distinct_jpeg(size, conversation)) for size in (SMALL, LARGE)]
    messages: list[dict] = [
        {"role": "user", "content": [*images, {"type": "text", "text": "Compare these two."}]}
    ]
    for earlier in range(turn):
        messages.append({"role": "assistant", "content": ASSISTANT_REPLIES[earlier]})
        messages.append({"role": "user", "content": FOLLOW_UPS[earlier]})
    return messages


# ---- bodies ----


def messages_for(kind: str, client: int, seq: int, clients: int) -> list[dict]:
    """`seq`: the client's own request count; a request's number is unique across clients."""
    number = seq * clients + client
    if kind == "text":
        return [{"role": "user", "content": TEXT_PROMPT}]
    if kind == "chat":
        return varied_messages(number)
    if kind in ("image", "photo", "photo-large"):
        size = LARGE if kind == "photo-large" else SMALL
        jpeg = synthetic_jpeg(size) if kind == "image" else distinct_jpeg(size, number)
        content = [image_part(jpeg), {"type": "text", "text": IMAGE_PROMPT}]
        return [{"role": "user", "content": content}]
    if kind == "turns":
        conversation, turn = divmod(seq, TURNS)
        return turn_messages(conversation * clients + client, turn)
    raise ValueError(f"unknown kind {kind!r}")


def body_maker(
    kind: str, model: str, stream: bool, max_tokens: int, clients: int
) -> Callable[[int, int], dict]:
    """(client, seq) -> a chat completion body; fixed kinds build theirs once."""

    def make(client: int, seq: int) -> dict:
        return {
            "model": model,
            "messages": messages_for(kind, client, seq, clients),
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": stream,
        }

    if kind in FIXED_KINDS:
        fixed = make(0, 0)
        return lambda client, seq: fixed
    return make
