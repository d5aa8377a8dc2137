"""A tiny Kimi-K2.5 model directory (`kimi_k25`, vLLM's KimiK25ForConditionalGeneration),
written at test time: a DeepSeek-V3 (MLA) decoder under a MoonViT-3D tower, seeded random
weights in the released checkpoint's names (optional), our locally trained BPE with Kimi's
special tokens (the released tokenizer is tiktoken-based), the released chat template's
structure and the released `preprocessor_config.json` (`media_proc_cfg`, what vLLM's Kimi
processor reads; it has no `image_processor_type`).

vLLM 0.32 runs Kimi-K2.5 on a CPU in bfloat16 only, and its MLA kernels take DeepSeek's
attention sizes only: a key/value latent of 512 and a rope head dim of 64. The config sets
`use_unified_vision_chunk`, without which vLLM's chat parser would hand the model "image"
items it does not take (its one modality is `vision_chunk`).

`tiny` caps an image at 256 patches (about 64 prompt tokens), so the e2e prompts stay short; the
parity tests and the benchmark take the released limits (16384 patches, 512 a side).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_TYPE = "kimi_k25"
ARCHITECTURE = "KimiK25ForConditionalGeneration"
BOS, EOS, PAD, UNK = "[BOS]", "[EOS]", "[PAD]", "[UNK]"
IM_USER, IM_ASSISTANT, IM_SYSTEM = "<|im_user|>", "<|im_assistant|>", "<|im_system|>"
IM_MIDDLE, IM_END = "<|im_middle|>", "<|im_end|>"
MEDIA_BEGIN, MEDIA_CONTENT = "<|media_begin|>", "<|media_content|>"
MEDIA_END, MEDIA_PAD = "<|media_end|>", "<|media_pad|>"
VIDEO_PLACEHOLDER = "<|kimi_k25_video_placeholder|>"
THINK, END_THINK = "<think>", "</think>"
TOOL_MARKERS = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
# In the released vocabulary's order (163584 [BOS] ... 163605 <|media_pad|> ...), after ours.
SPECIAL_TOKENS = (
    BOS,
    EOS,
    IM_END,
    IM_USER,
    IM_ASSISTANT,
    IM_SYSTEM,
    *TOOL_MARKERS,
    IM_MIDDLE,
    MEDIA_BEGIN,
    MEDIA_CONTENT,
    MEDIA_END,
    MEDIA_PAD,
    THINK,
    END_THINK,
    UNK,
    PAD,
    VIDEO_PLACEHOLDER,
)

# moonshotai/Kimi-K2.5's chat_template.jinja, its tool declaration and tool-call branches left
# out. An image part is written as "<|media_begin|>image<|media_content|><|media_pad|>
# <|media_end|>" and a newline (the line break before `{% elif` survives trim_blocks /
# lstrip_blocks), a video part as the video placeholder; content is read through a macro
# (`msg.get('content')`), which vLLM's content-format detection does not see through, so
# vLLM renders it in the "string" format.
CHAT_TEMPLATE = """\
{%- macro render_content(msg) -%}
    {%- set c = msg.get('content') -%}
    {%- if c is string -%}
      {{ c }}
    {%- elif c is not none -%}
      {% for content in c -%}
        {% if content['type'] == 'image' or content['type'] == 'image_url' -%}
          <|media_begin|>image<|media_content|><|media_pad|><|media_end|>
        {% elif content['type'] == 'video' or content['type'] == 'video_url' -%}
          <|kimi_k25_video_placeholder|>
        {% else -%}
          {{ content['text'] }}
        {%- endif -%}
      {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{% macro set_roles(message) -%}
  {%- set role_name = message.get('name') or message['role'] -%}
  {%- if message['role'] == 'user' -%}
    <|im_user|>{{role_name}}<|im_middle|>
  {%- elif message['role'] == 'assistant' -%}
    <|im_assistant|>{{role_name}}<|im_middle|>
  {%- else -%}
    <|im_system|>{{role_name}}<|im_middle|>
  {%- endif -%}
{%- endmacro -%}
{%- if messages|length == 0 or messages[0]['role'] != 'system' -%}
  <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>
{%- endif -%}
{%- for message in messages -%}
  {{set_roles(message)}}
  {%- if message['role'] == 'assistant' -%}
    <think></think>{{render_content(message)}}
  {%- else -%}
    {{render_content(message)}}
  {%- endif -%}
  <|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}
  <|im_assistant|>assistant<|im_middle|>
  {%- if thinking is defined and thinking is false -%}
    <think></think>
  {%- else -%}
    <think>
  {%- endif -%}
{%- endif -%}"""

# moonshotai/Kimi-K2.5's preprocessor_config.json: its auto_map (remote code) left out.
MEDIA_PROC_CFG: dict[str, Any] = {
    "in_patch_limit": 16384,
    "patch_size": 14,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "merge_kernel_size": 2,
    "fixed_output_tokens": None,
    "patch_limit_on_one_side": 512,
    "in_patch_limit_each_frame": 4096,
    "in_patch_limit_video": None,
    "sample_fps": 2.0,
    "max_num_frames_each_video": None,
    "temporal_merge_kernel_size": 4,
    "timestamp_mode": "hh:mm:ss.fff",
    "config_type": "media_proc_cfg",
}
TINY_PATCHES = 256  # in_patch_limit (and per video frame) of the `tiny` model: <= ~64 tokens

_TEXT: dict[str, Any] = {
    "model_type": "deepseek_v3",  # the released "kimi_k2", which transformers reads as this
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 2,  # dense layers only
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": None,
    "kv_lora_rank": 512,  # vLLM's CPU MLA takes DeepSeek's latent (512) and rope (64) only
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 64,
    "v_head_dim": 64,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "n_group": 1,
    "topk_group": 1,
    "max_position_embeddings": 4096,
    "rope_parameters": {"rope_type": "default", "rope_theta": 50_000.0},
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.15,
    "tie_word_embeddings": False,
}
_VISION: dict[str, Any] = {
    "patch_size": 14,
    "pos_emb_height": 64,
    "pos_emb_width": 64,
    "pos_emb_time": 4,
    "num_attention_heads": 2,  # head dim 32
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "merge_kernel_size": [2, 2],
    # Read by vLLM's MoonViT (the released vision config has them).
    "merge_type": "sd2_tpool",
    "mm_projector_type": "patchmerger",
    "video_attn_type": "spatial_temporal",
    "projector_ln_eps": 1e-5,
}
VISION_INIT = 1.0  # the vision tower and projector's weight scale: images must move the text


def build_model(out_dir: Path, weights: bool = True, tiny: bool = True) -> Path:
    """Write the tiny Kimi-K2.5 into `out_dir`: config, tokenizer, chat template, the released
    preprocessor config (with `tiny`, 256 patches an image), and with `weights` seeded random
    weights (a few MB)."""
    from transformers import Kimi_K25Config

    from engine_server.tiny_models import save_tokenizer, token_ids, write_json

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer()
    ids = token_ids(tokenizer, SPECIAL_TOKENS)
    text = {
        **_TEXT,
        "vocab_size": len(tokenizer),
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[EOS],
        "pad_token_id": ids[PAD],
    }
    config = Kimi_K25Config(
        text_config=text,
        vision_config=dict(_VISION),
        projection_hidden_size=_VISION["hidden_size"],
        image_token_id=ids[MEDIA_PAD],
        video_token_id=ids[VIDEO_PLACEHOLDER],
        vision_start_token_id=ids[MEDIA_BEGIN],
        vision_end_token_id=ids[MEDIA_END],
        use_unified_vision_chunk=True,
        media_placeholder_token_id=ids[MEDIA_PAD],
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    config.architectures = [ARCHITECTURE]
    config.save_pretrained(out_dir)
    if weights:
        _save_weights(config, out_dir)
        write_json(
            out_dir / "generation_config.json",
            {"bos_token_id": ids[BOS], "eos_token_id": ids[IM_END], "pad_token_id": ids[PAD]},
        )
    save_tokenizer(tokenizer, out_dir, CHAT_TEMPLATE)
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    media = dict(MEDIA_PROC_CFG)
    if tiny:
        media.update(in_patch_limit=TINY_PATCHES, in_patch_limit_each_frame=TINY_PATCHES)
    write_json(out_dir / "preprocessor_config.json", {"media_proc_cfg": media})
    return out_dir


def _tokenizer() -> Any:
    from engine_server.tiny_models import fast_tokenizer

    return fast_tokenizer(
        SPECIAL_TOKENS,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        chat_template=CHAT_TEMPLATE,
        model_max_length=_TEXT["max_position_embeddings"],
    )


def _save_weights(config: Any, out_dir: Path) -> None:
    """Seeded random weights under the released checkpoint's names: the decoder's from
    transformers' DeepseekV3ForCausalLM (under `language_model.`), the MoonViT tower's and
    the projector's written here (transformers 5 saves its own Kimi-K2.5 names, which vLLM
    does not load)."""
    import torch
    from safetensors.torch import save_file
    from transformers import DeepseekV3ForCausalLM

    from engine_server.tiny_models import SEED

    # Decoder and vision weights drawn in one seeded stream; the caller's RNG state is kept.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        decoder = DeepseekV3ForCausalLM(config.text_config)
        weights = {f"language_model.{k}": v for k, v in decoder.state_dict().items()}
        weights.update(_vision_weights(config))
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}
    save_file(weights, out_dir / "model.safetensors", metadata={"format": "pt"})


def _vision_weights(config: Any) -> dict[str, Any]:
    import torch

    vision = config.vision_config
    dim, inner = vision.hidden_size, vision.intermediate_size
    merged = dim * vision.merge_kernel_size[0] * vision.merge_kernel_size[1]
    patch = vision.patch_size

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape) * VISION_INIT / max(1.0, shape[-1] ** 0.5)

    out = {
        "vision_tower.patch_embed.proj.weight": rand(dim, 3, patch, patch),
        "vision_tower.patch_embed.proj.bias": rand(dim),
        "vision_tower.patch_embed.pos_emb.weight": rand(
            vision.pos_emb_height, vision.pos_emb_width, dim
        ),
        "vision_tower.encoder.final_layernorm.weight": torch.ones(dim),
        "vision_tower.encoder.final_layernorm.bias": torch.zeros(dim),
        "mm_projector.pre_norm.weight": torch.ones(dim),
        "mm_projector.pre_norm.bias": torch.zeros(dim),
        "mm_projector.proj.0.weight": rand(merged, merged),
        "mm_projector.proj.0.bias": rand(merged),
        "mm_projector.proj.2.weight": rand(config.text_config.hidden_size, merged),
        "mm_projector.proj.2.bias": rand(config.text_config.hidden_size),
    }
    for layer in range(vision.num_hidden_layers):
        block = f"vision_tower.encoder.blocks.{layer}."
        out.update(
            {
                block + "norm0.weight": torch.ones(dim),
                block + "norm0.bias": torch.zeros(dim),
                block + "norm1.weight": torch.ones(dim),
                block + "norm1.bias": torch.zeros(dim),
                block + "wqkv.weight": rand(3 * dim, dim),
                block + "wqkv.bias": rand(3 * dim),
                block + "wo.weight": rand(dim, dim),
                block + "wo.bias": rand(dim),
                block + "mlp.fc0.weight": rand(inner, dim),
                block + "mlp.fc0.bias": rand(inner),
                block + "mlp.fc1.weight": rand(dim, inner),
                block + "mlp.fc1.bias": rand(dim),
            }
        )
    return out


class VllmImageProcessor:
    """vLLM's own Kimi-K2.5 image processor (KimiK25FusedVisionProcessor, from the model dir's
    media_proc_cfg: what vLLM runs for this model, not transformers' Kimi_K25ImageProcessor)
    behind transformers' call shape, for the benchmark's reference column."""

    def __init__(self, model_dir: Path) -> None:
        from vllm.transformers_utils.processors.kimi_k25_vision_fused import (
            KimiK25FusedVisionProcessor,
        )

        self.processor = KimiK25FusedVisionProcessor.from_pretrained(str(model_dir))

    def __call__(
        self,
        images: list[Any],
        return_tensors: str = "np",
        do_rescale: bool = True,
        do_normalize: bool = True,
    ) -> Any:
        chunks = [{"type": "image", "image": image} for image in images]
        return self.processor.preprocess(
            chunks, return_tensors=return_tensors, do_rescale=do_rescale, do_normalize=do_normalize
        )
