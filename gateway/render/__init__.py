"""Messages to a prompt, as vLLM renders it: model files, chat templates, content formats, the
conversation, tokenization; `prompt.PromptBuilder` adds the preprocessed media items."""
