"""The OpenAI Responses API (/v1/responses) on the chat path, with a bounded response store."""
