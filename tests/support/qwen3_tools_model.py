"""A tiny random-weight Qwen3 chat model for tool-call and reasoning tests, written at test time.

Qwen3ForCausalLM with the tiny Qwen tokenizer (`engine_server.tiny_models`) plus Qwen3's own
markers as added, non-special tokens (as in the released tokenizer: `<think>`, `</think>`,
`<tool_call>`, `</tool_call>`, `<tool_response>`, `</tool_response>`), and Qwen3's chat
template: tools in the system turn, tool calls and tool results in the history, reasoning
dropped from earlier turns, `enable_thinking: false` closing the thought in the prompt.

A random model never calls a tool by itself: tests force its output per request with
structured outputs (`choice` / `regex`), or let a tool_choice grammar drive it.
"""

from __future__ import annotations

from pathlib import Path

from engine_server import tiny_models as tm

# How the tests serve it, as vLLM's server is told to: the qwen3 reasoning parser on the engines
# (vLLM's engine holds a structured output back until the thought ends), hermes tool calls on
# the servers, and the engines' grammar enforced in the thought too, so a forced output covers
# it.
PARSER_FLAGS = {"reasoning_parser": "qwen3"}
SERVER_FLAGS = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
ENGINE = {"structured_outputs_config": {"enable_in_reasoning": True}, "max_model_len": 2048}
GATEWAY_ARGS = (
    "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
)  # fmt: skip

MARKERS = (
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"
)  # fmt: skip

# Qwen3's released template (Qwen/Qwen3-8B), unchanged in substance.
CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501


def build_model(out_dir: Path) -> Path:
    """The model directory (a few MB; float32)."""
    from tokenizers import AddedToken
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = tm.qwen_tokenizer(CHAT_TEMPLATE)
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    config = Qwen3Config(
        **tm.text_config_kwargs(tokenizer), head_dim=32, tie_word_embeddings=True, dtype="float32"
    )
    model = tm.seeded_model(lambda: Qwen3ForCausalLM(config))
    tm.save_decoder(model, tokenizer, out_dir, CHAT_TEMPLATE)
    return out_dir
