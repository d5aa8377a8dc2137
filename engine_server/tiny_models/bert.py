"""The tiny BERT embedding model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_server.tiny_models.files import save_tokenizer, seeded_model
from engine_server.tiny_models.tokenizer import base_tokenizer

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def bert_tokenizer() -> Any:
    """The tiny BERT tokenizer: BERT_SPECIAL_TOKENS, every sequence framed by [CLS] ... [SEP]."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok = base_tokenizer(BERT_SPECIAL_TOKENS)
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


def build_embedding_model(out_dir: Path) -> Path:
    """Tiny BertModel that vLLM serves as an "embed" pooling model (CLS pooling)."""
    from transformers import BertConfig, BertModel

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = bert_tokenizer()
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
    model = seeded_model(lambda: BertModel(config, add_pooling_layer=False))
    model.save_pretrained(out_dir)
    save_tokenizer(tokenizer, out_dir)
    return out_dir
