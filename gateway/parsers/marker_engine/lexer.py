"""Text into terminals and content (vLLM's ``IncrementalLexer``)."""

from __future__ import annotations

from collections.abc import Sequence

CONTENT_TERMINAL = "__CONTENT__"


class Lexer:
    """Splits text into terminals and content, holding back a tail that may start a terminal."""

    def __init__(self, literals: Sequence[tuple[str, str]]) -> None:
        self._literals = list(literals)  # (literal, terminal name)
        self._first_chars = frozenset(lit[0] for lit, _ in self._literals)
        self._prefixes = frozenset(lit[:i] for lit, _ in self._literals for i in range(1, len(lit)))
        self._by_first: dict[str, list[tuple[str, str]]] = {}
        for lit, name in self._literals:
            self._by_first.setdefault(lit[0], []).append((lit, name))
        self.buffer = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        if not self.buffer and self._first_chars.isdisjoint(text):
            return [(CONTENT_TERMINAL, text)]
        self.buffer += text
        return self._drain(final=False)

    def flush(self) -> list[tuple[str, str]]:
        tokens = self._drain(final=True) if self.buffer else []
        if self.buffer:
            tokens.append((CONTENT_TERMINAL, self.buffer))
            self.buffer = ""
        return tokens

    def _longest_match(self) -> tuple[str, str] | None:
        best: tuple[str, str] | None = None
        for lit, name in self._by_first.get(self.buffer[0], ()):
            if self.buffer.startswith(lit) and (best is None or len(lit) > len(best[1])):
                best = (name, lit)
        return best

    def _drain(self, *, final: bool) -> list[tuple[str, str]]:
        tokens: list[tuple[str, str]] = []
        while self.buffer:
            if self._first_chars.isdisjoint(self.buffer):
                tokens.append((CONTENT_TERMINAL, self.buffer))
                self.buffer = ""
                break
            best = self._longest_match()
            may_grow = best is None or self._longer_literal_possible(len(best[1]))
            if self.buffer in self._prefixes and not final and may_grow:
                break  # the buffer may still become a (longer) terminal: wait for more text
            if best is not None:
                tokens.append(best)
                self.buffer = self.buffer[len(best[1]) :]
                continue
            end = self._content_boundary() or 1
            tokens.append((CONTENT_TERMINAL, self.buffer[:end]))
            self.buffer = self.buffer[end:]
        return tokens

    def _longer_literal_possible(self, matched: int) -> bool:
        return any(
            len(lit) > matched and lit.startswith(self.buffer)
            for lit, _ in self._by_first.get(self.buffer[0], ())
        )

    def _content_boundary(self) -> int:
        buf = self.buffer
        for i in range(1, len(buf)):
            if buf[i] not in self._first_chars:
                continue
            rest = len(buf) - i
            for lit, _ in self._literals:
                n = min(rest, len(lit))
                if buf[i : i + n] == lit[:n]:
                    return i
        return len(buf)
