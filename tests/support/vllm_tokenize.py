"""vLLM's own /tokenize and /detokenize handlers, run offline (no engine) as a reference."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any


class VllmTokenization:
    def __init__(self, model: Path, max_model_len: int = 1024, **model_options: Any) -> None:
        from vllm.config import ModelConfig, VllmConfig
        from vllm.entrypoints.openai.models.protocol import BaseModelPath
        from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
        from vllm.entrypoints.serve.tokenize.serving import ServingTokenization
        from vllm.renderers import renderer_from_config
        from vllm.renderers.online_renderer import OnlineRenderer

        config = ModelConfig(model=str(model), max_model_len=max_model_len, **model_options)
        renderer = renderer_from_config(VllmConfig(model_config=config))
        online = OnlineRenderer(
            config,
            renderer,
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
        )
        registry = OpenAIModelRegistry(
            config, [BaseModelPath(name=str(model), model_path=str(model))]
        )
        self.serving = ServingTokenization(
            registry, online, chat_template=None, chat_template_content_format="auto"
        )

    def tokenize(self, body: dict) -> dict:
        from vllm.entrypoints.serve.tokenize.protocol import (
            TokenizeChatRequest,
            TokenizeCompletionRequest,
        )

        kind = TokenizeChatRequest if "messages" in body else TokenizeCompletionRequest
        reply = asyncio.run(self.serving.create_tokenize(kind(**body), None))
        return reply.model_dump()

    def detokenize(self, tokens: list[int]) -> dict:
        from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest

        reply = asyncio.run(self.serving.create_detokenize(DetokenizeRequest(tokens=tokens), None))
        return reply.model_dump()
