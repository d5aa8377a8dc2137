"""Deterministic tiny random-weight models that real vLLM (CPU) can load.

Tests and demos need real engines but no model hub is reachable, so we train a
small byte-level BPE on Python stdlib sources and save random-weight checkpoints
in exactly the on-disk layout HF/vLLM expect (Qwen2, Qwen2-VL, BERT).

Heavy dependencies (torch, transformers, tokenizers) are imported lazily so that
importing this module stays cheap for processes that only need cached paths.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Bump whenever the produced files change so stale caches are never reused.
BUILD_VERSION = "2"
KINDS = ("text", "vision", "embedding")
SEED = 1234

# 3000 merged symbols keep embeddings tiny while still tokenising English/code
# into multi-byte pieces, so prompts of a few hundred chars stay short.
_BPE_VOCAB = 3000

# A fixed, sorted stdlib subset: ~0.9 MB of code+docstrings trains in well
# under a second. Alternatives cover stdlib renames across Python versions; the vocab
# always reaches _BPE_VOCAB, so special-token ids do not depend on the version.
_CORPUS_FILES: tuple[tuple[str, ...], ...] = (
    ("argparse.py",),
    ("ast.py",),
    ("base64.py",),
    ("calendar.py",),
    ("collections/__init__.py",),
    ("dataclasses.py",),
    ("difflib.py",),
    ("email/message.py",),
    ("enum.py",),
    ("functools.py",),
    ("json/decoder.py",),
    ("json/encoder.py",),
    ("logging/__init__.py",),
    ("pathlib.py", "pathlib/_local.py"),
    ("string.py",),
    ("textwrap.py",),
    ("typing.py",),
)

# Qwen2's pre-tokenizer split: keeps our token boundaries Qwen-like.
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
# Text and vision share one vocabulary (as real Qwen2 does), so ids line up.
QWEN_SPECIAL_TOKENS = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    VISION_START,
    VISION_END,
    IMAGE_PAD,
    VIDEO_PAD,
)
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Qwen2.5-Instruct's template: ChatML with Hermes-style tool calling.
QWEN2_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n\
{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) \
or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Qwen2-VL-Instruct's template, verbatim apart from line wrapping.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Shared decoder dims. head_dim = 128 / 4 = 32 is the smallest size vLLM's CPU
# attention kernels accept.
_TEXT_DIMS: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    # Wide weights: at the usual 0.02 a random model repeats one token forever; at 0.5 greedy
    # output is varied text, split multi-byte characters included, which tests need.
    "initializer_range": 0.5,
}

# Caps an image at 256 14px patches = 64 LLM tokens after the 2x2 merge, so
# profiling and requests stay fast; min is Qwen's usual 56*56.
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 64


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for candidates in _CORPUS_FILES:
        path = next((stdlib / c for c in candidates if (stdlib / c).is_file()), None)
        if path is not None:
            texts.append(path.read_text(encoding="utf-8"))
    if not texts:
        raise RuntimeError(f"no training text found under {stdlib}")
    return texts


@functools.lru_cache(maxsize=1)
def _bpe_json() -> str:
    """Train the shared BPE once per process; JSON so callers get fresh copies."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok.to_str()


def _base_tokenizer(special_tokens: tuple[str, ...]) -> Any:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(_bpe_json())
    # Appended after the learned vocab, like Qwen, so ids are stable per vocab size.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    return tok


def _qwen_tokenizer(chat_template: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=_base_tokenizer(QWEN_SPECIAL_TOKENS),
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=chat_template,
        model_max_length=_TEXT_DIMS["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def _bert_tokenizer() -> Any:
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = _base_tokenizer(BERT_SPECIAL_TOKENS)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    # BERT pools the first token, so every sequence must start with [CLS].
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


def _ids(tokenizer: Any, tokens: tuple[str, ...]) -> dict[str, int]:
    return {t: tokenizer.convert_tokens_to_ids(t) for t in tokens}


def _seeded_model(factory: Callable[[], Any]) -> Any:
    import torch

    # fork_rng keeps the caller's global RNG state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return factory().eval()


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def _patch_tokenizer_files(out_dir: Path, tokenizer: Any, template: str | None) -> None:
    # transformers 5 records the class as "TokenizersBackend" (unknown to 4.x),
    # keeps the template only in chat_template.jinja and writes no
    # special_tokens_map.json. Older readers need all three; naming the generic
    # fast class also guarantees tokenizer.json is used verbatim everywhere.
    path = out_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if template is not None:
        cfg["chat_template"] = template
    _write_json(path, cfg)
    _write_json(out_dir / "special_tokens_map.json", tokenizer.special_tokens_map)


def _save_tokenizer(tokenizer: Any, out_dir: Path, template: str | None = None) -> None:
    tokenizer.save_pretrained(out_dir)
    _patch_tokenizer_files(out_dir, tokenizer, template)


def _save_decoder(model: Any, tokenizer: Any, out_dir: Path, template: str) -> None:
    from transformers import GenerationConfig

    ids = _ids(tokenizer, (ENDOFTEXT, IM_END))
    # Only token ids: vLLM turns any sampling fields here into request defaults.
    model.generation_config = GenerationConfig(
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=[ids[IM_END], ids[ENDOFTEXT]],
        pad_token_id=ids[ENDOFTEXT],
    )
    model.save_pretrained(out_dir)
    _save_tokenizer(tokenizer, out_dir, template)


def _text_config_kwargs(tokenizer: Any) -> dict[str, Any]:
    ids = _ids(tokenizer, (ENDOFTEXT, IM_END))
    return {
        **_TEXT_DIMS,
        "vocab_size": len(tokenizer),
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[ENDOFTEXT],
    }


def build_text_model(out_dir: Path) -> Path:
    """Tiny Qwen2ForCausalLM chat model with a ChatML + tools template."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _qwen_tokenizer(QWEN2_CHAT_TEMPLATE)
    config = Qwen2Config(
        **_text_config_kwargs(tokenizer),
        tie_word_embeddings=True,
        dtype="float32",
    )
    model = _seeded_model(lambda: Qwen2ForCausalLM(config))
    _save_decoder(model, tokenizer, out_dir, QWEN2_CHAT_TEMPLATE)
    return out_dir


def build_vision_model(out_dir: Path) -> Path:
    """Tiny Qwen2VLForConditionalGeneration plus a Qwen2VLProcessor."""
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _qwen_tokenizer(QWEN2_VL_CHAT_TEMPLATE)
    ids = _ids(tokenizer, QWEN_SPECIAL_TOKENS)
    text = _text_config_kwargs(tokenizer)
    rope_theta = text.pop("rope_theta")
    # M-RoPE splits the head_dim/2 = 16 rotary pairs across (t, h, w).
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": rope_theta,
        "mrope_section": [4, 6, 6],
    }
    config = Qwen2VLConfig(
        text_config=text,
        vision_config={
            "depth": 2,
            "embed_dim": 64,
            "num_heads": 2,  # head_dim 32, same CPU attention constraint
            "mlp_ratio": 4,
            "hidden_size": _TEXT_DIMS["hidden_size"],  # merger projects into the LLM
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
        dtype="float32",
    )
    model = _seeded_model(lambda: Qwen2VLForConditionalGeneration(config))
    _save_decoder(model, tokenizer, out_dir, QWEN2_VL_CHAT_TEMPLATE)

    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size),
        video_processor=Qwen2VLVideoProcessor(size=size),
        tokenizer=tokenizer,
        chat_template=QWEN2_VL_CHAT_TEMPLATE,
    )
    processor.save_pretrained(out_dir)  # rewrites the tokenizer files too
    _patch_tokenizer_files(out_dir, tokenizer, QWEN2_VL_CHAT_TEMPLATE)
    _write_legacy_preprocessor_configs(processor, out_dir)
    return out_dir


def _write_legacy_preprocessor_configs(processor: Any, out_dir: Path) -> None:
    # transformers 5 nests both processors in processor_config.json; transformers
    # 4.x and hand-rolled preprocessors read these flat files with the
    # min_pixels/max_pixels spelling instead.
    pixels = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
    for name, sub in (
        ("preprocessor_config.json", processor.image_processor),
        ("video_preprocessor_config.json", processor.video_processor),
    ):
        _write_json(out_dir / name, {**sub.to_dict(), **pixels})


def build_embedding_model(out_dir: Path) -> Path:
    """Tiny BertModel that vLLM serves as an "embed" pooling model (CLS pooling)."""
    from transformers import BertConfig, BertModel

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _bert_tokenizer()
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,  # head_dim 32 for vLLM's CPU attention
        intermediate_size=256,
        max_position_embeddings=512,
        type_vocab_size=2,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    # vLLM's BertModel has no pooler layer and rejects unknown weights.
    model = _seeded_model(lambda: BertModel(config, add_pooling_layer=False))
    model.save_pretrained(out_dir)
    _save_tokenizer(tokenizer, out_dir)
    return out_dir


_BUILDERS: dict[str, Callable[[Path], Path]] = {
    "text": build_text_model,
    "vision": build_vision_model,
    "embedding": build_embedding_model,
}


def default_cache_root() -> Path:
    """`$MMGATE_CACHE/models` (default ~/.cache/mmgate/models). The gateway keeps model files
    from workers' bundles beside it, in `bundles/` (gateway.render.bundle.cache_root)."""
    env = os.environ.get("MMGATE_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "mmgate") / "models"


def ensure_model(kind: str, cache_root: Path | None = None) -> Path:
    """Return cache_root/<kind>-<BUILD_VERSION>, building it on first use."""
    builder = _BUILDERS.get(kind)
    if builder is None:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS}")
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    final = root / f"{kind}-{BUILD_VERSION}"
    # The final dir only ever appears via rename, so existing means complete.
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        builder(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache may be shared
        try:
            os.rename(tmp, final)
        except OSError:
            # A concurrent builder won the race; its copy is identical.
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
