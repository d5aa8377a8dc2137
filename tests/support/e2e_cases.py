"""Shared pieces of the end-to-end tests: test images, the chat prompts and requests built on
them, and vLLM's own answers to compare with."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image
from vllm import SamplingParams
from vllm.inputs.engine import tokens_input
from vllm.sampling_params import RequestOutputKind

MM_LIMITS = {"image": 4, "video": 1}  # the vision workers' --limit-mm-per-prompt
# The shared Qwen2-VL pair (tests/e2e/gateway/conftest.py): room for two videos and four
# images; 2048 holds the clip past vLLM's frame cap (384 temporal patches of 4 tokens).
QWEN2VL_LIMITS = {"image": 4, "video": 2}
QWEN2VL_CONTEXT = 2048  # the tiny model's max_position_embeddings
QWEN2VL_ENGINE = {"limit_mm_per_prompt": QWEN2VL_LIMITS, "max_model_len": QWEN2VL_CONTEXT}
# The system and user turns the text tests chat with.
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime number."},
]


def make_image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    gradient = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    noise = rng.integers(0, 64, (height, width, 3)).astype(np.float32)
    return Image.fromarray(np.clip(gradient + noise, 0, 255).astype(np.uint8), "RGB")


def chat_prompt(processor, images, videos=()) -> str:
    parts = [{"type": "image"} for _ in images] + [{"type": "video"} for _ in videos]
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": "Describe."}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


IMAGE = make_image(150, 110, seed=21)


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def ask(gateway, *urls: str):
    client = gateway.client()
    content = [
        *({"type": "image_url", "image_url": {"url": url, "detail": "auto"}} for url in urls),
        {"type": "text", "text": "Describe."},
    ]
    return client.chat.completions.create(
        model=client.models.list().data[0].id,
        temperature=0,
        max_tokens=12,
        messages=[{"role": "user", "content": content}],
        extra_body={"ignore_eos": True},
    )


def vllm_says(reference, prompt, name, **params):
    """Token ids, or text that vLLM tokenizes itself as it does for a completion."""
    params = SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, **params)
    prompt = prompt if isinstance(prompt, str) else tokens_input(prompt)
    return reference.generate(prompt, params, name).outputs
