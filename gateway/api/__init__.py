"""The OpenAI endpoints: request models (with vLLM's extensions) and one service per route."""
