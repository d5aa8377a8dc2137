"""The chat service's parser orchestration (``gateway.parsers.delegating`` and
``request_adjust``) against vLLM 0.32's server, per deployment (reasoning parser, tool parser)
and request (tool_choice, include_reasoning, parallel_tool_calls, chat_template_kwargs).

The reference is what ``vllm/entrypoints/openai/chat_completion/serving.py`` does: the parser class
from ``ParserManager.get_parser``, ``adjust_request`` on the request, a parser per choice built
with the request's tools and template kwargs; ``parse`` on the whole output then the serving
layer's own rules (``content or ""`` for a forced call, reasoning dropped when not included,
``maybe_filter_parallel_tool_calls``); ``parse_delta`` per token delta with the prompt's ids.
Ours goes through ``plan_parsing`` and ``ChoiceParser`` as ``gateway/api/chat.py`` does (a final
``delta("", True)`` ends a stream). The model outputs and tokenizers are the parser families' own
test samples; prompts are rendered by hand, ending in the family's generation prompt, and reach
vLLM as ids and ours as the tokens' vocabulary strings (``ChatService.token_strings``).

Compared: whole replies (reasoning, content, calls, finish reason); streams token by token,
assembled; the same streams as one delta and as two deltas cut at a few token boundaries (never
inside a marker); the prompt check (``prompt_ends_reasoning``, ``grammar_from_first_token``).
Where ours differs for a reason inside a parser, the case is a strict xfail (KNOWN_DIFFERENCES).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from gateway.api.protocol import ChatCompletionRequest
from gateway.errors import GatewayError, parse_body
from gateway.parsers.config import ParsingConfig, TokenizerVocab
from gateway.parsers.request_adjust import grammar_from_first_token, plan_parsing
from tests.unit.gateway.parsers import test_deepseek_v3_parsers as dsv3
from tests.unit.gateway.parsers import test_forced_calls as forced
from tests.unit.gateway.parsers import test_gemma4_parsers as gemma4
from tests.unit.gateway.parsers import test_glm45_parsers as glm45
from tests.unit.gateway.parsers import test_gptoss_parsers as gptoss
from tests.unit.gateway.parsers import test_hermes_tool_parser as hermes
from tests.unit.gateway.parsers import test_kimi_k2_parsers as kimi
from tests.unit.gateway.parsers import test_llama3_json_parsers as llama3
from tests.unit.gateway.parsers import test_minimax_m2_parsers as minimax
from tests.unit.gateway.parsers import test_mistral_parsers as mistral
from tests.unit.gateway.parsers import test_pythonic_parsers as pythonic
from tests.unit.gateway.parsers import test_qwen3_coder_parsers as qwen3_coder
from tests.unit.gateway.parsers.test_mistral_parsers import _VocabOnce
from tests.unit.gateway.parsers.vllm_reference import TOOL_ID_RE, TOOLS, tokenizer

NAMED = {"type": "function", "function": {"name": "get_weather"}}
CHOICES: dict[str, Any] = {"auto": "auto", "none": "none", "required": "required", "named": NAMED}
MISTRAL_ID_RE = re.compile(r"[A-Za-z0-9]{9}")
RANDOM_ID = "chatcmpl-tool-0123456789abcdef"
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]

Calls = list[tuple[str | None, str, str]]
Reply = tuple[str | None, str | None, Calls, str]  # reasoning, content, calls, finish reason


# ── One deployment: parsers, tokenizer, prompts, outputs ─────────────────────────────────────


@dataclass(frozen=True)
class Prompt:
    """A rendered prompt ending in the generation prompt, and the template kwargs it came from."""

    text: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Deployment:
    reasoning: str | None
    tool: str | None
    tok: Callable[[], Any]  # the family's test tokenizer (harmony's is built on first use)
    tools: list[dict[str, Any]]
    prompts: dict[str, Prompt]  # "default" first
    samples: dict[str, str]
    core: tuple[str, ...]  # the samples tried with every request variant
    # Outputs of a forced call (keyed "required_..." / "named_...") held to vLLM's generic JSON.
    forced_samples: dict[str, str] = field(default_factory=dict)
    harmony: bool = False

    def config(self) -> ParsingConfig:
        return ParsingConfig(
            reasoning_parser=self.reasoning,
            tool_call_parser=self.tool,
            enable_auto_tool_choice=self.tool is not None,
        )


def _hf_vocab(tok: Any) -> TokenizerVocab:
    """What ``ChatService`` reads from the tokenizer's added tokens."""
    added = tok.added_tokens_decoder.values()
    return TokenizerVocab(
        special_tokens=frozenset(t.content for t in added if t.special),
        added_tokens=frozenset(t.content for t in added),
    )


def _token_strings(tok: Any, ids: list[int]) -> list[str]:
    """``ChatService.token_strings``: each token's vocabulary string."""
    if hasattr(tok, "convert_ids_to_tokens"):
        return list(tok.convert_ids_to_tokens(ids))
    return [tok.decode([i]) for i in ids]


def _token_stream(text: str, tok: Any) -> list[tuple[str, list[int]]]:
    """(text, ids) per streamed delta, token by token; a token ending mid-character waits for
    the next, as vLLM's incremental detokenizer does."""
    ids = tok.encode(text)
    out: list[tuple[str, list[int]]] = []
    sent, start = "", 0
    for n in range(1, len(ids) + 1):
        decoded = tok.decode(ids[:n], skip_special_tokens=False)
        if not decoded.endswith("\ufffd"):
            out.append((decoded[len(sent) :], ids[start:n]))
            sent, start = decoded, n
    assert sent == text, (sent, text)
    return out


# ── vLLM ──────────────────────────────────────────────────────────────────────────────────────


@dataclass
class Case:
    deployment: Deployment
    sample: str
    choice: str
    include_reasoning: bool = True
    prompt: str = "default"
    parallel: bool | None = None

    @property
    def text(self) -> str:
        d = self.deployment
        return d.samples[self.sample] if self.sample in d.samples else d.forced_samples[self.sample]

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "m",
            "messages": MESSAGES,
            "tools": self.deployment.tools,
            "tool_choice": CHOICES[self.choice],
            "include_reasoning": self.include_reasoning,
        }
        if self.parallel is not None:
            body["parallel_tool_calls"] = self.parallel
        kwargs = self.deployment.prompts[self.prompt].kwargs
        if kwargs:
            body["chat_template_kwargs"] = kwargs
        return body


@functools.cache
def _vllm_class(tool: str | None, reasoning: str | None, harmony: bool) -> Any:
    from vllm.parser.parser_manager import ParserManager

    # vLLM logs a traceback for every body its parsers fail to read; expected here.
    for name in ("vllm.tool_parsers", "vllm.parser", "vllm.reasoning", "vllm.entrypoints"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    cls = ParserManager.get_parser(
        tool_parser_name=tool,
        reasoning_parser_name=reasoning,
        enable_auto_tools=True,
        is_harmony=harmony,
    )
    # For harmony vLLM sets the parsers on HarmonyParser itself: keep this deployment's.
    parsers = {"reasoning_parser_cls": cls.reasoning_parser_cls}
    parsers["tool_parser_cls"] = cls.tool_parser_cls
    return type(cls.__name__, (cls,), parsers) if harmony else cls


class VllmServer:
    """vLLM's server for one request: its adjusted request and a parser per choice."""

    def __init__(self, case: Case) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as Req

        d = case.deployment
        self.tok = d.tok()
        self.cls = _vllm_class(d.tool, d.reasoning, d.harmony)
        self.kwargs = d.prompts[case.prompt].kwargs
        request = Req(**case.body())
        # The renderer adjusts the request with a parser of its own (harmony: no kwargs).
        adjusting = self.cls(self.tok, request.tools, **self._extra(d))
        self.request = adjusting.adjust_request(request)
        self.prompt_ids = self.tok.encode(d.prompts[case.prompt].text)

    def _extra(self, d: Deployment) -> dict[str, Any]:
        return {} if d.harmony else {"chat_template_kwargs": dict(self.kwargs)}

    def parser(self) -> Any:
        # serving.py's _make_parser: chat_template_kwargs always passed.
        return self.cls(self.tok, self.request.tools, chat_template_kwargs=dict(self.kwargs))

    def whole(self, text: str) -> Reply:
        """chat_completion_full_generator's message and finish reason (the engine stopped)."""
        request = self.request
        reasoning, content, calls = self.parser().parse(
            text, request, enable_auto_tools=True, model_output_token_ids=self.tok.encode(text)
        )
        calls = list(calls or [])
        if not request.include_reasoning:
            reasoning = None
        named = not isinstance(request.tool_choice, str | None)
        required = request.tool_choice == "required"
        if named or required:
            content = content or ""
        elif request.tool_choice in (None, "none"):
            calls = []
        finish = "tool_calls" if (calls and not named) or required else "stop"
        if request.parallel_tool_calls is False:  # maybe_filter_parallel_tool_calls
            calls = calls[:1]
        # ToolCall(id=tc.id or make_tool_call_id(), ...)
        return reasoning, content, [(c.id or RANDOM_ID, c.name, c.arguments) for c in calls], finish

    def stream(self, deltas: Sequence[tuple[str, list[int]]]) -> Assembled:
        """chat_completion_stream_generator's deltas, folded, and its finish reason."""
        parser, out = self.parser(), Assembled()
        streamed_calls = False
        for i, (text, ids) in enumerate(deltas):
            msg = parser.parse_delta(
                text, list(ids), self.request, self.prompt_ids, finished=i == len(deltas) - 1
            )
            if msg is None:
                continue
            streamed_calls = streamed_calls or bool(msg.tool_calls)
            calls = [
                (c.index, c.id, c.function and c.function.name, c.function and c.function.arguments)
                for c in msg.tool_calls
            ]
            if self.request.parallel_tool_calls is False:  # maybe_filter_parallel_tool_calls
                calls = [c for c in calls if c[0] == 0]
            out.add(msg.reasoning, msg.content, calls)
        named = not isinstance(self.request.tool_choice, str | None)
        out.finish_reason = "tool_calls" if streamed_calls and not named else "stop"
        return out


# ── Ours ──────────────────────────────────────────────────────────────────────────────────────


def refused(case: Case) -> bool:
    """A forced call on a parser whose forced calls the gateway does not reproduce (Mistral):
    refused with a 400 rather than answered differently from vLLM."""
    from gateway.parsers import TOOL_PARSERS

    tool = case.deployment.tool
    forced = case.choice in ("required", "named")
    return forced and tool is not None and not TOOL_PARSERS[tool].forced_calls_supported


def assert_refused(case: Case) -> None:
    with pytest.raises(GatewayError, match="is not supported with --tool-call-parser"):
        Gateway(case)


class Gateway:
    """The chat service for one request: ``plan_parsing`` then a ``ChoiceParser`` per choice."""

    def __init__(self, case: Case) -> None:
        d = case.deployment
        tok = d.tok()
        self.request = parse_body(ChatCompletionRequest, case.body())
        prompt_ids = tok.encode(d.prompts[case.prompt].text)
        vocab = _harmony_vocab() if d.harmony else _hf_vocab(tok)
        parsing = plan_parsing(
            d.config(), self.request, lambda: _token_strings(tok, prompt_ids), vocab
        )
        assert parsing is not None
        self.parsing = parsing

    def whole(self, text: str) -> Reply:
        parser = self.parsing.choice()
        parsed = parser.whole(text)
        content = self.parsing.message_content(parsed.content)
        calls = [(c.id, c.name, c.arguments) for c in parsed.tool_calls]
        finish = self.parsing.finish_reason(parser.called, "stop", streamed=False)
        return parsed.reasoning, content, calls, finish

    def stream(self, deltas: Sequence[str]) -> Assembled:
        parser, out = self.parsing.choice(), Assembled()
        messages = [parser.delta(d, False) for d in deltas] + [parser.delta("", True)]
        for msg in messages:
            if msg is not None:
                calls = [(c.index, c.id, c.name, c.arguments) for c in msg.tool_calls]
                out.add(msg.reasoning, msg.content, calls)
        out.finish_reason = self.parsing.finish_reason(parser.called, "stop", streamed=True)
        return out


@dataclass
class Assembled:
    """A stream folded back together: what a client ends up with."""

    reasoning: str = ""
    content: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [name, arguments]
    ids: dict[int, str] = field(default_factory=dict)
    finish_reason: str | None = None

    def add(self, reasoning: str | None, content: str | None, calls: Sequence[tuple]) -> None:
        self.reasoning += reasoning or ""
        self.content += content or ""
        for index, call_id, name, arguments in calls:
            entry = self.calls.setdefault(index, ["", ""])
            entry[0] += name or ""
            entry[1] += arguments or ""
            if call_id is not None:
                self.ids[index] = call_id

    def comparable(self) -> tuple:
        ids = {i: _id_kind(v) for i, v in self.ids.items()}
        return self.reasoning, self.content, self.calls, ids, self.finish_reason


def _id_kind(call_id: str | None) -> str | None:
    """Random ids only share a format; ids read from the output (Kimi) must be equal."""
    if call_id is None:
        return None
    if TOOL_ID_RE.fullmatch(call_id):
        return "<random>"
    if MISTRAL_ID_RE.fullmatch(call_id):
        return "<mistral>"
    return call_id


def _whole_comparable(reply: Reply) -> tuple:
    reasoning, content, calls, finish = reply
    return reasoning, content, [(_id_kind(i), n, a) for i, n, a in calls], finish


@functools.cache
def _harmony_vocab() -> TokenizerVocab:
    markers = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>")
    markers += ("<|return|>", "<|call|>", "<|endoftext|>", "<|startoftext|>")
    return TokenizerVocab(special_tokens=frozenset(markers), added_tokens=frozenset(markers))


# ── Deployments ───────────────────────────────────────────────────────────────────────────────


def _cached(tok: Any) -> Callable[[], Any]:
    """The tokenizer with its vocabulary built once (vLLM's parsers ask for it per instance)."""
    return functools.cache(lambda: _VocabOnce(tok))


def _pick(samples: dict[str, str], *names: str) -> dict[str, str]:
    return {n: samples[n] for n in names}


def _prefixed(prefix: str, samples: dict[str, str], *names: str) -> dict[str, str]:
    return {f"thought_{n}": prefix + samples[n] for n in names}


QWEN_USER = "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
QWEN_PROMPTS = {
    "default": Prompt(f"{QWEN_USER}<|im_start|>assistant\n"),
    # Qwen3's template with enable_thinking=False closes the thought in the prompt.
    "thinking_off": Prompt(
        f"{QWEN_USER}<|im_start|>assistant\n<think>\n\n</think>\n\n", {"enable_thinking": False}
    ),
}
THOUGHT = "<think>\nThe user wants the weather.\n</think>\n\n"
HERMES_SAMPLES = {
    **_pick(
        hermes.SAMPLES,
        "single_call",
        "parallel_calls",
        "text_before_call",
        "cut_off_mid_json",
        "invalid_json",
        "no_call",
    ),
    **_prefixed(THOUGHT, hermes.SAMPLES, "single_call", "parallel_calls", "no_call"),
    "call_inside_thought": f"<think>Call it.{hermes.PARIS}",
    "thought_cut_off": "<think>Let me think about",
}
HERMES_CORE = ("single_call", "no_call", "thought_single_call", "thought_no_call")
QWEN3_CODER_SAMPLES = {
    **_pick(
        qwen3_coder.SAMPLES,
        "single_call",
        "typed_parameters",
        "parallel_calls",
        "text_before_call",
        "cut_off_in_string_value",
        "unknown_tool",
        "no_call",
    ),
    **_prefixed(THOUGHT, qwen3_coder.SAMPLES, "single_call", "parallel_calls", "no_call"),
    "call_inside_thought": f"<think>Call it.{qwen3_coder.PARIS}",
    "no_start_tag": f"Call it.</think>\n\n{qwen3_coder.PARIS}",
}
R1_THOUGHT = "The user wants the weather.\n</think>\n\n"
R1_USER = "<｜begin▁of▁sentence｜><｜User｜>What is the weather in Paris?"
GLM_USER = "[gMASK]<sop><|user|>\nWhat is the weather in Paris?"
GLM_SAMPLES = {
    **_pick(
        glm45.TOOL_SAMPLES,
        "single_call",
        "single_call_glm47",
        "parallel_calls",
        "text_before_call",
        "cut_off_in_value",
        "unknown_tool_dropped",
        "no_call",
    ),
    **_prefixed(THOUGHT, glm45.TOOL_SAMPLES, "single_call", "parallel_calls", "no_call"),
    **_pick(
        glm45.REASONING_SAMPLES,
        "tool_call_inside_reasoning",
        "never_closed",
        "reasoning_again_in_content",
    ),
}
LLAMA_PROMPT = Prompt(
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWeather in Paris?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
LLAMA4_PROMPT = Prompt(
    "<|header_start|>user<|header_end|>\n\nWeather in Paris?<|eot|>"
    "<|header_start|>assistant<|header_end|>\n\n"
)
# Forced calls on a parser without a native format: the engine was held to vLLM's JSON.
FORCED_SAMPLES = {
    **{f"required_{n}": forced.REQUIRED_SAMPLES[n] for n in forced.REQUIRED_SAMPLES},
    **{f"named_{n}": forced.NAMED_SAMPLES[n] for n in forced.NAMED_SAMPLES},
}
FORCED_PICK = (
    "required_single_call",
    "required_several_calls",
    "required_cut_off_mid_parameters",
    "required_text_before_array",
    "required_empty",
    "named_arguments_object",
    "named_cut_off",
    "named_whitespace",
)
MISTRAL_PROMPT = Prompt("<s>[INST]What is the weather in Paris?[/INST]")
MISTRAL_SAMPLES = {
    **_pick(
        mistral.V11_SAMPLES,
        "single_call",
        "parallel_calls",
        "text_before_call",
        "cut_off_mid_arguments",
        "invalid_json",
        "no_call",
    ),
    **_pick(
        mistral.REASONING_SAMPLES,
        "reasoning_then_call",
        "reasoning_then_answer",
        "call_inside_reasoning",
        "never_closed",
        "content_before_reasoning",
    ),
}
GEMMA_USER = "<bos><|turn>user\nWhat is the weather in Paris?<turn|>\n"
GEMMA_PROMPTS = {
    "default": Prompt(f"{GEMMA_USER}<|turn>model\n"),
    "thinking": Prompt(f"{GEMMA_USER}<|turn>model\n", {"enable_thinking": True}),
    # After a tool response the template may leave the thought channel open.
    "open_channel": Prompt(
        f"{GEMMA_USER}<|turn>model\n<|channel>thought\n", {"enable_thinking": True}
    ),
}
GEMMA_SAMPLES = {
    **_pick(
        gemma4.TOOL_SAMPLES,
        "single_call",
        "parallel_calls",
        "text_before_call",
        "cut_off_mid_arguments",
        "unknown_tool",
        "no_call",
    ),
    **_pick(
        gemma4.REASONING_SAMPLES,
        "reasoning_then_call",
        "reasoning_then_answer",
        "call_inside_reasoning",
        "no_start_tag",
        "never_closed",
    ),
}
KIMI_USER = "<|im_user|>user<|im_middle|>What is the weather in Paris?<|im_end|>"
KIMI_PROMPTS = {
    "default": Prompt(f"{KIMI_USER}<|im_assistant|>assistant<|im_middle|>"),
    "thinking_off": Prompt(
        f"{KIMI_USER}<|im_assistant|>assistant<|im_middle|><think></think>", {"thinking": False}
    ),
}
KIMI_SAMPLES = {
    **_pick(
        kimi.TOOL_SAMPLES,
        "single_call",
        "parallel_calls",
        "text_before_call",
        "cut_off_mid_arguments",
        "no_call",
    ),
    **_pick(
        kimi.REASONING_SAMPLES,
        "reasoning_then_call",
        "reasoning_then_answer",
        "call_inside_reasoning",
        "no_start_tag",
        "never_closed",
    ),
}
DSV3_USER = "<｜begin▁of▁sentence｜><｜User｜>What is the weather in Paris?<｜Assistant｜>"
DSV3_PROMPTS = {
    # DeepSeek V3.1's template: "<think>" opens a thought when thinking, "</think>" otherwise.
    "default": Prompt(f"{DSV3_USER}</think>"),
    "thinking": Prompt(f"{DSV3_USER}<think>", {"thinking": True}),
}
DSV3_SAMPLES = {
    **_pick(
        dsv3.TOOL_SAMPLES,
        "single_call",
        "parallel_calls",
        "text_before_call",
        "cut_off_mid_arguments",
        "no_call",
    ),
    **_pick(dsv3.REASONING_SAMPLES, "reasoning_then_call", "reasoning_then_answer"),
    "no_start_tag_then_call": f"Call it.</think>{dsv3.TOOL_SAMPLES['single_call']}",
}
GPTOSS_PROMPT = Prompt(
    "<|start|>system<|message|>You are ChatGPT.<|end|>"
    "<|start|>user<|message|>What is the weather in Paris?<|end|><|start|>assistant"
)
GPTOSS_SAMPLES = _pick(
    gptoss.SAMPLES,
    "analysis_then_final",
    "analysis_then_call",
    "several_calls",
    "preamble_then_call",
    "call_cut_off_mid_arguments",
    "analysis_cut_off",
    "final_only",
    "not_harmony",
)

DEPLOYMENTS: dict[str, Deployment] = {
    "qwen3+hermes": Deployment(
        "qwen3", "hermes", _cached(tokenizer()), TOOLS, QWEN_PROMPTS, HERMES_SAMPLES, HERMES_CORE
    ),
    "qwen3+qwen3_coder": Deployment(
        "qwen3",
        "qwen3_coder",
        _cached(tokenizer()),
        qwen3_coder.TOOLS,
        QWEN_PROMPTS,
        QWEN3_CODER_SAMPLES,
        ("single_call", "no_call", "thought_single_call", "thought_no_call"),
    ),
    "none+hermes": Deployment(
        None,
        "hermes",
        _cached(tokenizer()),
        TOOLS,
        {"default": QWEN_PROMPTS["default"]},
        HERMES_SAMPLES,
        ("single_call", "no_call", "thought_single_call"),
    ),
    "deepseek_r1+hermes": Deployment(
        "deepseek_r1",
        "hermes",
        _cached(tokenizer()),
        TOOLS,
        {
            # DeepSeek-R1's template opens the thought in the prompt.
            "default": Prompt(f"{R1_USER}<｜Assistant｜><think>\n"),
            "no_think_in_prompt": Prompt(f"{R1_USER}<｜Assistant｜>"),
        },
        {
            **_pick(HERMES_SAMPLES, "single_call", "no_call", "thought_single_call"),
            **_prefixed(R1_THOUGHT, hermes.SAMPLES, "single_call", "parallel_calls", "no_call"),
            "thought_cut_off": "Let me think about",
        },
        ("thought_single_call", "thought_no_call", "single_call"),
    ),
    "glm45+glm45": Deployment(
        "glm45",
        "glm45",
        _cached(glm45.TOK),
        qwen3_coder.TOOLS,
        {
            "default": Prompt(f"{GLM_USER}<|assistant|>"),
            "thinking_off": Prompt(
                f"{GLM_USER}<|assistant|>\n<think></think>\n", {"enable_thinking": False}
            ),
        },
        GLM_SAMPLES,
        ("single_call", "no_call", "thought_single_call", "thought_no_call"),
    ),
    "none+llama3_json": Deployment(
        None,
        "llama3_json",
        _cached(llama3.TOK),
        TOOLS,
        {"default": LLAMA_PROMPT},
        _pick(
            llama3.SAMPLES,
            "single_call",
            "python_tag",
            "parallel_calls",
            "text_before_call",
            "cut_off_mid_arguments",
            "invalid_json",
            "no_call",
        ),
        ("single_call", "python_tag", "no_call"),
    ),
    "none+pythonic": Deployment(
        None,
        "pythonic",
        _cached(tokenizer()),
        forced.TOOLS,
        {"default": LLAMA_PROMPT},
        _pick(
            pythonic.SAMPLES,
            "single_call",
            "parallel_calls",
            "text_before_call",
            "cut_off_mid_arguments",
            "no_call",
        ),
        ("single_call", "no_call"),
        _pick(FORCED_SAMPLES, *FORCED_PICK),
    ),
    "none+llama4_pythonic": Deployment(
        None,
        "llama4_pythonic",
        _cached(pythonic.LLAMA4_TOK),
        forced.TOOLS,
        {"default": LLAMA4_PROMPT},
        _pick(
            pythonic.LLAMA4_SAMPLES,
            "single_call",
            "python_markers",
            "python_start_only",
            "python_markers_text_after",
            "no_call",
        ),
        ("python_markers", "no_call"),
        _pick(FORCED_SAMPLES, *FORCED_PICK[:3], *FORCED_PICK[5:7]),
    ),
    "mistral+mistral": Deployment(
        "mistral",
        "mistral",
        lambda: mistral.V11_THINK,
        TOOLS,
        {"default": MISTRAL_PROMPT},
        MISTRAL_SAMPLES,
        ("single_call", "no_call", "reasoning_then_call", "reasoning_then_answer"),
    ),
    "none+mistral_pre_v11": Deployment(
        None,
        "mistral",
        lambda: mistral.PRE_V11,
        TOOLS,
        {"default": MISTRAL_PROMPT},
        _pick(
            mistral.PRE_V11_SAMPLES,
            "single_call",
            "parallel_calls",
            "text_before_call",
            "cut_off_mid_arguments",
            "garbage",
            "no_call",
        ),
        ("single_call", "no_call"),
    ),
    "gemma4+gemma4": Deployment(
        "gemma4",
        "gemma4",
        _cached(gemma4.TOK),
        TOOLS,
        GEMMA_PROMPTS,
        GEMMA_SAMPLES,
        ("single_call", "no_call", "reasoning_then_call", "reasoning_then_answer"),
    ),
    "kimi_k2+kimi_k2": Deployment(
        "kimi_k2",
        "kimi_k2",
        _cached(kimi.TOK),
        TOOLS,
        KIMI_PROMPTS,
        KIMI_SAMPLES,
        ("single_call", "no_call", "reasoning_then_call", "reasoning_then_answer"),
    ),
    "deepseek_v3+deepseek_v31": Deployment(
        "deepseek_v3",
        "deepseek_v31",
        _cached(dsv3.TOK),
        TOOLS,
        DSV3_PROMPTS,
        DSV3_SAMPLES,
        ("single_call", "no_call", "reasoning_then_call", "reasoning_then_answer"),
    ),
    # MiniMax-M2 is served with vLLM's minimax_m2 tool parser, which the gateway lacks: the
    # reasoning parser alone (tool_choice "none" only).
    "minimax_m2+none": Deployment(
        "minimax_m2",
        None,
        _cached(minimax.TOK),
        TOOLS,
        {"default": QWEN_PROMPTS["default"]},
        _pick(
            minimax.SAMPLES,
            "reasoning_then_answer",
            "with_start_tag",
            "never_closed",
            "reasoning_then_tool_call",
            "ends_in_marker_prefix",
        ),
        ("reasoning_then_answer", "reasoning_then_tool_call"),
    ),
    "openai_gptoss+openai": Deployment(
        "openai_gptoss",
        "openai",
        gptoss._tok,
        TOOLS,
        {"default": GPTOSS_PROMPT},
        GPTOSS_SAMPLES,
        ("analysis_then_final", "analysis_then_call", "several_calls"),
        harmony=True,
    ),
    # vLLM always reads gpt-oss output as harmony, a tool parser or not.
    "openai_gptoss+none": Deployment(
        "openai_gptoss",
        None,
        gptoss._tok,
        TOOLS,
        {"default": GPTOSS_PROMPT},
        _pick(GPTOSS_SAMPLES, "analysis_then_final", "analysis_then_call", "analysis_cut_off"),
        ("analysis_then_final", "analysis_then_call"),
        harmony=True,
    ),
}


# ── Cases ─────────────────────────────────────────────────────────────────────────────────────


def _cases() -> list[Case]:
    """Core samples: every tool_choice, with and without reasoning, every prompt. The others:
    tool_choice auto, every prompt, and "none" (what an engine-based tool parser reads then is
    dropped). Parallel calls once more with parallel_tool_calls=False; forced JSON outputs under
    their tool_choice."""
    cases: list[Case] = []
    for d in DEPLOYMENTS.values():
        choices = list(CHOICES) if d.tool else ["none"]
        includes = (True, False) if d.reasoning else (True,)
        for sample in d.samples:
            core = sample in d.core
            for prompt in d.prompts:
                for choice in choices if core else choices[:1]:
                    # Reasoning hidden: the default prompt is enough.
                    for include in includes if core and prompt == "default" else (True,):
                        cases.append(Case(d, sample, choice, include, prompt))
            if not core and d.tool:
                cases.append(Case(d, sample, "none"))
            if "parallel" in sample or "several" in sample:
                for choice in ("auto", "required"):
                    cases.append(Case(d, sample, choice, parallel=False))
        for sample in d.forced_samples:
            choice = sample.split("_", 1)[0]
            cases.append(Case(d, sample, choice))
            if "several" in sample:
                cases.append(Case(d, sample, choice, parallel=False))
    return cases


def _case_id(case: Case) -> str:
    name = next(k for k, v in DEPLOYMENTS.items() if v is case.deployment)
    parts = [name, case.sample, case.choice, case.prompt]
    if not case.include_reasoning:
        parts.append("hidden_reasoning")
    if case.parallel is False:
        parts.append("no_parallel")
    return "-".join(parts)


# ── Known differences: inside the parsers, not the orchestration ─────────────────────────────

OPEN_CHANNEL = (
    "gemma4, prompt ending inside <|channel>thought: vLLM's Gemma4 parser starts the stream in "
    "reasoning (adjust_initial_state_from_prompt); our reasoning parsers have no such hook "
    "(only prompt_ends_reasoning), so the stream starts in content. Whole replies match "
    "(vLLM's parse ignores the prompt)"
)
PRE_V11_NONE = (
    'mistral, pre-v11 vocabulary, tool_choice "none", streamed: vLLM\'s MistralParser reads '
    "tool_choice on this path and leaves the call markup out of a stream (engine-based) while "
    "its whole reply keeps it as content; MistralPreV11ToolParser has no tool_choice and "
    "follows the whole reply"
)
# "test:case id" -> why ours differs (strict: each must still differ).
KNOWN_DIFFERENCES = {
    **dict.fromkeys(
        [
            f"token:none+mistral_pre_v11-{sample}-none-default"
            for sample in (
                "single_call",
                "parallel_calls",
                "text_before_call",
                "cut_off_mid_arguments",
                "garbage",
            )
        ],
        PRE_V11_NONE,
    ),
    **dict.fromkeys(
        [
            "batched:gemma4+gemma4-no_call-auto-open_channel",
            "batched:gemma4+gemma4-no_call-required-open_channel",
            "token:gemma4+gemma4-no_call-auto-open_channel",
            "token:gemma4+gemma4-no_call-named-open_channel",
            "token:gemma4+gemma4-no_call-none-open_channel",
            "token:gemma4+gemma4-no_call-required-open_channel",
            "token:gemma4+gemma4-no_start_tag-auto-open_channel",
            "token:gemma4+gemma4-text_before_call-auto-open_channel",
        ],
        OPEN_CHANNEL,
    ),
}


def _params(test: str, cases: list[Case]) -> list[Any]:
    params = []
    for case in cases:
        case_id = _case_id(case)
        reason = KNOWN_DIFFERENCES.get(f"{test}:{case_id}")
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(case, id=case_id, marks=marks))
    return params


# ── Tests ─────────────────────────────────────────────────────────────────────────────────────

CASES = _cases()


@functools.cache
def _deltas(text: str, tok: Any) -> list[tuple[str, list[int]]]:
    return _token_stream(text, tok)


@pytest.mark.parametrize("case", _params("whole", CASES))
def test_whole_reply_matches_vllm(case: Case) -> None:
    if refused(case):
        return assert_refused(case)
    expected = VllmServer(case).whole(case.text)
    assert _whole_comparable(Gateway(case).whole(case.text)) == _whole_comparable(expected)


@pytest.mark.parametrize("case", _params("token", CASES))
def test_token_stream_matches_vllm(case: Case) -> None:
    if refused(case):
        return assert_refused(case)
    deltas = _deltas(case.text, case.deployment.tok())
    expected = VllmServer(case).stream(deltas)
    ours = Gateway(case).stream([t for t, _ in deltas])
    assert ours.comparable() == expected.comparable(), [t for t, _ in deltas]


def _batched(deltas: list[tuple[str, list[int]]]) -> list[list[tuple[str, list[int]]]]:
    """The stream as one delta, and split in two at a few token boundaries (a busy engine
    sends several tokens at once; a boundary never cuts a marker)."""

    def joined(part: list[tuple[str, list[int]]]) -> tuple[str, list[int]]:
        return "".join(t for t, _ in part), [i for _, ids in part for i in ids]

    cuts = sorted({len(deltas) * k // 5 for k in range(1, 5)} - {0, len(deltas)})
    return [[joined(deltas)]] + [[joined(deltas[:c]), joined(deltas[c:])] for c in cuts]


BATCHED = [c for c in CASES if c.sample in c.deployment.core and c.choice in ("auto", "required")]


@pytest.mark.parametrize("case", _params("batched", BATCHED))
def test_batched_stream_matches_vllm(case: Case) -> None:
    if refused(case):
        return assert_refused(case)
    for deltas in _batched(_deltas(case.text, case.deployment.tok())):
        expected = VllmServer(case).stream(deltas)
        ours = Gateway(case).stream([t for t, _ in deltas])
        assert ours.comparable() == expected.comparable(), [t for t, _ in deltas]


PROMPT_CASES = [
    Case(d, next(iter(d.samples)), "auto" if d.tool else "none", include, prompt)
    for d in DEPLOYMENTS.values()
    if d.reasoning
    for prompt in d.prompts
    for include in (True, False)
]


@pytest.mark.parametrize("case", _params("prompt", PROMPT_CASES))
def test_prompt_check_matches_vllm(case: Case) -> None:
    """Whether the prompt closed the thought (vLLM's ``is_reasoning_end`` on its ids), and so
    whether a grammar applies from the first token (``resolve_reasoning_ended``)."""
    server, ours = VllmServer(case), Gateway(case)
    parser = server.parser()
    assert ours.parsing.prompt_ends_reasoning == parser.is_reasoning_end(server.prompt_ids)
    expected = server.request.resolve_reasoning_ended(parser, server.prompt_ids)
    assert grammar_from_first_token(ours.parsing, ours.request) == bool(expected)


def test_every_known_difference_is_a_case() -> None:
    tests = {"whole": CASES, "token": CASES, "batched": BATCHED, "prompt": PROMPT_CASES}
    ids = {f"{test}:{_case_id(c)}" for test, cases in tests.items() for c in cases}
    assert set(KNOWN_DIFFERENCES) <= ids
