"""POST /tokenize and /detokenize, as vLLM's server answers them.

/tokenize takes a completion-style `prompt` or chat-style `messages` (rendered with the chat
template, images expanded into their placeholder tokens as the engine would receive them).
"""

from __future__ import annotations

from typing import Any

from gateway.api.protocol import DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest
from gateway.errors import GatewayError, check_model, parse_body
from gateway.render.model_files import ModelFiles
from gateway.render.prompt import PromptBuilder
from gateway.stream.detokenizer import decode_prompt
from multimodal.pipeline import PixelEncoding

# Token ids do not depend on the pixel encoding; uint8 is the cheapest to produce.
_IDS_ONLY = PixelEncoding(raw=True)


class TokenizeService:
    def __init__(
        self, model_name: str, files: ModelFiles, prompts: PromptBuilder, max_model_len: int
    ) -> None:
        self.model_name, self.prompts, self.max_model_len = model_name, prompts, max_model_len
        self.files = files
        self.tokenizer = files.tokenizer

    async def tokenize(self, body: Any) -> dict:
        is_chat = isinstance(body, dict) and "messages" in body
        model = TokenizeChatRequest if is_chat else TokenizeCompletionRequest
        request = parse_body(model, body)
        check_model(request.model, self.model_name)
        if is_chat:
            ids = (await self.prompts.build(request, _IDS_ONLY)).ids
        else:
            ids = self.tokenizer.encode(
                request.prompt, add_special_tokens=request.add_special_tokens
            ).ids
        strs = [self.tokenizer.id_to_token(i) for i in ids] if request.return_token_strs else None
        return {
            "count": len(ids),
            "max_model_len": self.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }

    async def detokenize(self, body: Any) -> dict:
        request = parse_body(DetokenizeRequest, body)
        check_model(request.model, self.model_name)
        vocab = self.tokenizer.get_vocab_size(with_added_tokens=True)
        if bad := [t for t in request.tokens if not 0 <= t < vocab]:
            raise GatewayError(f"token id {bad[0]} is out of vocabulary", 400, "tokens")
        return {"prompt": decode_prompt(self.tokenizer, request.tokens, self.files.clean_up_spaces)}
