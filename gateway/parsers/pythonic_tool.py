"""``--tool-call-parser pythonic`` and ``llama4_pythonic``: vLLM 0.32's ``PythonicToolParser``
(``vllm/tool_parsers/pythonic_tool_parser.py``) and ``Llama4PythonicToolParser``
(``llama4_pythonic_tool_parser.py``), with their helpers in ``vllm/tool_parsers/utils.py``.

Calls are a Python list of calls with keyword arguments, ``[get_weather(city='Paris'), f()]``;
Llama 4 may wrap it in ``<|python_start|>`` ... ``<|python_end|>``. Behaviour reproduced
(auto tool choice):

- Non-streaming: the text must start like a call list (vLLM's ``TOOL_CALL_REGEX``, rewritten
  here without its nested quantifiers) and its first statement must parse (``ast``) as a list
  of calls whose arguments are literals; otherwise it is all content. Content is ``None`` when
  there are calls; text after the list survives only if the whole text still parses.
- Streaming reads calls only when the text so far starts with ``[`` (or ``<|python_start|>``);
  other text is content, delta by delta. The text is closed (brackets, quotes) into valid
  Python, parsed, and each call's ``json.dumps`` arguments are sent as they grow, holding back
  the closing characters the completion added. Text that never parses sends nothing.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from typing import Any

from gateway.parsers.base import (
    DeltaMessage,
    DeltaToolCall,
    ToolCall,
    ToolCallResult,
    ToolParser,
    make_tool_call_id,
)

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"

# vLLM's TOOL_CALL_REGEX, ``\[(N\((N=.*,\s*)*(N=.*\s)?\),\s*)*(N\((N=.*,\s*)*(N=.*\s*)?\)\s*)+\]``
# (DOTALL, matched at the start), accepts the same texts as this form: calls without arguments,
# then one whose ``.*`` runs to the last ``)`` before ``]``. Python's re has no timeout (vLLM's
# regex module has one), so the nested ``.*`` quantifiers, exponential on some inputs, go.
_NAME = r"[a-zA-Z]\w*"
_TOOL_CALL_RE = re.compile(
    rf"\[(?:{_NAME}\(\),\s*)*(?:{_NAME}\(\)\s*)*{_NAME}\((?:{_NAME}=.*)?\)\s*\]", re.DOTALL
)
_JSON_NAME_LITERALS = {"null": None, "true": True, "false": False}
_CLOSING = {"[": "]", "(": ")", "{": "}", "'": "'", '"': '"'}


class UnexpectedAstError(Exception):
    """The text parsed, but not as a list of calls with literal arguments."""


def _parameter_value(val: ast.expr) -> Any:
    """vLLM's ``get_parameter_value``: the JSON value of a literal argument."""
    if isinstance(val, ast.Constant):
        if val.value is None or isinstance(val.value, (str, int, float)):
            return val.value
        raise UnexpectedAstError("Tool call arguments must be JSON values")
    if isinstance(val, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in val.keys):
            raise UnexpectedAstError("Dict tool call arguments must have literal keys")
        return {k.value: _parameter_value(v) for k, v in zip(val.keys, val.values)}  # type: ignore[union-attr]
    if isinstance(val, (ast.List, ast.Tuple, ast.Set)):
        return [_parameter_value(v) for v in val.elts]
    if isinstance(val, ast.JoinedStr) and all(isinstance(p, ast.Constant) for p in val.values):
        return "".join(str(p.value) for p in val.values)  # type: ignore[attr-defined]
    if isinstance(val, ast.Name) and val.id in _JSON_NAME_LITERALS:
        return _JSON_NAME_LITERALS[val.id]
    if isinstance(val, ast.UnaryOp) and isinstance(val.op, (ast.USub, ast.UAdd)):
        operand = _parameter_value(val.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(val.op, ast.USub) else operand
    raise UnexpectedAstError("Tool call arguments must be literals")


def _dotted_name(node: ast.expr) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise UnexpectedAstError("Invalid tool call name")
    parts.append(node.id)
    return ".".join(reversed(parts))


def _call(node: ast.expr) -> ToolCall:
    """vLLM's ``handle_single_tool``; positional arguments are ignored, as there."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)):
        raise UnexpectedAstError("Invalid tool call name")
    arguments = {kw.arg: _parameter_value(kw.value) for kw in node.keywords}
    return ToolCall(
        name=_dotted_name(node.func), arguments=json.dumps(arguments, ensure_ascii=False)
    )


def _parse_calls(source: str) -> list[ToolCall]:
    """The calls of the list the source's first statement is; raises otherwise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        module = ast.parse(source)
    parsed = getattr(module.body[0], "value", None)
    if not isinstance(parsed, ast.List) or not all(isinstance(e, ast.Call) for e in parsed.elts):
        raise UnexpectedAstError("Tool output must be a list of function calls")
    return [_call(e) for e in parsed.elts]


def _is_escaped(text: str, index: int) -> bool:
    backslashes = 0
    while index - backslashes - 1 >= 0 and text[index - backslashes - 1] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _open_brackets(text: str) -> list[str]:
    """Brackets and quotes still open at the end of ``text``; raises on a mismatch."""
    stack: list[str] = []
    for index, char in enumerate(text):
        if stack and stack[-1] in "'\"":
            # Inside a string only its closing quote counts.
            if char == stack[-1] and not _is_escaped(text, index):
                stack.pop()
            continue
        if char in "[({'\"":
            stack.append(char)
        elif char in ")]}" and (not stack or _CLOSING[stack.pop()] != char):
            raise UnexpectedAstError("Mismatched brackets")
    return stack


def make_valid_python(text: str) -> tuple[str, str] | None:
    """vLLM's ``make_valid_python``: (text closed into valid Python, the closers added), or
    ``None`` while the text is too incomplete (mid-name, mid-key, right after ``=``)."""
    stack = _open_brackets(text)
    text = text.rstrip()
    if text.endswith(("=", ":")):
        return None
    if stack and stack[-1] == "{":
        before = text[: text.rfind("{")]
        if before.count(":") <= before.count(","):
            return None
    if stack and stack[-1] == "(":
        before = text[: text.rfind("(")]
        if before.count("=") <= before.count(","):
            return None
    if text.endswith(","):
        text = text[:-1]
    if stack and stack[-1] == "[" and not text.endswith(("[", ")")):
        return None
    added = "".join(_CLOSING[c] for c in reversed(stack))
    candidate = text + added
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            module = ast.parse(candidate)
    except SyntaxError:
        return None
    if not module.body:
        return None
    # A "}" we added that makes a set means a dict cut mid-key, not a set argument.
    if "}" in added and any(isinstance(node, ast.Set) for node in ast.walk(module)):
        return None
    return candidate, added


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def __init__(self) -> None:
        self._text = ""
        self._tool_index = -1
        self._streamed_args: list[str] = []
        self._called = False
        self._last_call_index: int | None = None

    def _unwrap(self, text: str) -> str:
        """The call list inside a whole output (Llama 4 strips its markers here)."""
        return text

    def _stream_text(self) -> str | None:
        """The streamed text to read as calls, ``None`` when it is content."""
        return self._text if self._text.startswith("[") else None

    def extract(self, text: str) -> ToolCallResult:
        source = self._unwrap(text)
        if _TOOL_CALL_RE.match(source) is None:
            return ToolCallResult(False, [], text)
        try:
            calls = _parse_calls(source)
        except Exception:  # SyntaxError, ValueError (NUL), RecursionError...: vLLM's catch-all
            return ToolCallResult(False, [], text)
        return ToolCallResult(True, calls, None)

    def feed(self, delta_text: str) -> DeltaMessage | None:
        self._text += delta_text
        source = self._stream_text()
        if source is None:
            msg: DeltaMessage | None = DeltaMessage(content=delta_text)
        else:
            try:
                msg = self._step(source)
            except Exception:
                msg = None  # vLLM logs and skips the chunk
        self._last_call_index = msg.tool_calls[-1].index if msg and msg.tool_calls else None
        return msg

    def finish(self) -> DeltaMessage | None:
        # vLLM's finalize_generation appends the "unstreamed" arguments of a fake last call
        # with arguments {} (the parser's own hack) to the last delta's last call.
        if self._last_call_index is None or not self._called:
            return None
        sent = self._streamed_args[0] if self._streamed_args else ""
        remaining = "{}"[len(sent) :] if "{}".startswith(sent) else ""
        if not remaining:
            return None
        return DeltaMessage(tool_calls=[DeltaToolCall(self._last_call_index, arguments=remaining)])

    def _step(self, source: str) -> DeltaMessage | None:
        valid = make_valid_python(source)
        if valid is None:
            return None
        valid_text, added = valid
        calls = _parse_calls(valid_text)
        pieces: list[DeltaToolCall] = []
        for index, call in enumerate(calls):
            if index < self._tool_index:
                continue
            self._tool_index = index
            if len(self._streamed_args) == index:
                self._streamed_args.append("")
            complete = index < len(calls) - 1 or ")]" not in added
            if complete:
                self._tool_index += 1
            piece = self._call_piece(index, call, self._withheld(added, complete))
            if piece is not None:
                pieces.append(piece)
                self._streamed_args[index] += piece.arguments or ""
        if pieces:
            self._called = True
            return DeltaMessage(tool_calls=pieces)
        if not added and self._tool_index > 0:
            return DeltaMessage(content="")  # vLLM's empty delta once the list is closed
        return None

    @staticmethod
    def _withheld(added: str, complete: bool) -> str:
        """The end of the JSON arguments that only exists because the text was closed."""
        if complete:
            return ""
        # added ends with ")]"; an open call's arguments then end with a "}" not yet written.
        withheld = added[:-2] + ("}" if added[-2] == ")" else "")
        return withheld.replace("'", '"')  # Python quotes became JSON quotes

    def _call_piece(self, index: int, call: ToolCall, withheld: str) -> DeltaToolCall | None:
        """vLLM's ``compute_tool_delta``."""
        args = call.arguments
        if withheld:
            if not args.endswith(withheld):
                raise ValueError("arguments do not end with the withheld suffix")
            args = args[: -len(withheld)]
        sent = self._streamed_args[index]
        if not sent:
            # Also when earlier pieces were empty: vLLM then sends the head again.
            return DeltaToolCall(
                index, id=make_tool_call_id(), type="function", name=call.name, arguments=args
            )
        diff = args[len(sent) :]
        return DeltaToolCall(index, arguments=diff) if diff else None


class Llama4PythonicToolParser(PythonicToolParser):
    name = "llama4_pythonic"

    def _unwrap(self, text: str) -> str:
        if text.startswith(PYTHON_START):
            return text[len(PYTHON_START) :].replace(PYTHON_END, "")
        return text

    def _stream_text(self) -> str | None:
        text = self._text
        if not text.startswith(("[", PYTHON_START)):
            return None
        if text.startswith(PYTHON_START):
            text = text[len(PYTHON_START) :]
        if text.endswith(PYTHON_END):
            text = text[: text.rfind(PYTHON_END)]
        return text
