"""A worker's output back to the client: per-choice accumulation of the Generate stream,
incremental detokenization with stop strings, logprobs, and server-sent events."""
