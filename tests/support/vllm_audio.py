"""vLLM's own audio path, run offline: the reference the gateway's audio families are held to.

`vllm_audio_inputs` loads each clip with vLLM's MediaConnector (its "auto" audio loader: decode
at the clip's rate, channels averaged), lets the model's data parser resample it to the feature
extractor's rate (torchaudio, as the chat path does) and runs the model's multimodal processor
on the chat prompt, as `vllm serve` does for a chat with `input_audio` parts. It returns the
unexpanded and expanded prompt ids and every item's tensors, which the gateway's must equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.vllm_video import _array, _setup


def vllm_audio_inputs(
    model: Path,
    audios: Sequence[str],
    images: Sequence[Any] = (),
    text: str = "What is this?",
    **config: Any,
) -> dict[str, Any]:
    """{"rendered_ids": the template's ids (one audio token per clip), "prompt_token_ids": the
    expanded ids, "ranges": {modality: [(offset, length), ...]}, "dtype": the model's,
    "fields": {modality: {key: (field class name, its dim, keep_on_cpu)}}, "audio":
    [{tensor name: array}, ...], "image": [...]} for a user message of the images' parts,
    then the clips' (URLs: data: URIs), then `text`. `config`: more of vLLM's ModelConfig."""
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    processor, connector, _, tokenizer = _setup(model, config)
    loaded = [connector.fetch_audio(url) for url in audios]
    content = [{"type": "image"}] * len(images) + [{"type": "audio"}] * len(audios)
    chat = [{"role": "user", "content": [*content, {"type": "text", "text": text}]}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    data: dict[str, list[Any]] = {"audio": loaded}
    if images:
        data["image"] = list(images)
    items = processor.info.parse_mm_data(data)
    out = processor.apply(ProcessorInputs(ids, items), TimingContext(enabled=False))
    result: dict[str, Any] = {
        "rendered_ids": list(ids),
        "prompt_token_ids": list(out["prompt_token_ids"]),
        "ranges": {
            modality: [(p.offset, p.length) for p in ranges]
            for modality, ranges in out["mm_placeholders"].items()
        },
        "dtype": str(processor.info.ctx.model_config.dtype).removeprefix("torch."),
        "fields": {},
    }
    for modality, kwargs_items in out["mm_kwargs"].items():
        result[modality] = [
            {key: _array(element.data) for key, element in item.items()} for item in kwargs_items
        ]
        result["fields"][modality] = {
            key: (
                type(element.field).__name__,
                getattr(element.field, "dim", None),
                element.field.keep_on_cpu,
            )
            for item in kwargs_items
            for key, element in item.items()
        }
    return result
