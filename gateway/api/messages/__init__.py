"""The Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`) on the chat path,
as vLLM's `vllm/entrypoints/anthropic` serves it: a request becomes a chat request, the chat
run's reply and chunks become a Message and Anthropic's stream events."""
