"""A text-only port of vLLM 0.32's declarative parser engine (``vllm/parser/engine/``).

vLLM describes several model formats (Gemma 4, Kimi K2, MiniMax M2, ...) as a grammar of marker
strings ("terminals") and a state machine over them, and runs every such grammar through one
engine: ``IncrementalLexer`` (``incremental_lexer.py``), ``StreamingParserEngine``
(``streaming_parser_engine.py``), ``ParserEngine`` (``parser_engine.py``) and the adapters that
serve an engine as a ``--reasoning-parser`` or a ``--tool-call-parser`` (``adapters.py``, run by
``DelegatingParser`` in ``vllm/parser/abstract_parser.py``). This package reproduces that engine
closely enough that the output, whole and streamed, is vLLM's; the family modules
(``gemma4_tool.py``, ``kimi_k2_tool.py``, ``minimax_m2_reasoning.py``, ``mistral_tool.py``, ...)
only supply a ``Grammar`` and their model-specific hooks. Its modules, in the order text runs
through them:

- ``grammar``: ``Grammar`` (terminals, transitions, options), ``State``, the events
  ``Ev``/``Event``;
- ``lexer``: ``Lexer``, text into terminals and content;
- ``machine``: ``Machine``, terminals into events;
- ``engine``: ``Engine``, events into deltas and whole results (subclassed for a family's hooks),
  with ``call_pieces`` (calls being assembled) and ``schema_coercion`` (argument types);
- ``adapters``: ``EngineToolParser``, ``EngineReasoningParser``, ``suppresses_calls``.

Text-only streaming. vLLM matches the grammar's special-token markers by token id while
streaming, and treats the same text arriving any other way (cut across two deltas) as plain
text. A marker token always lands whole inside one detokenized delta, so here a token marker
counts while streaming when its whole text lies inside one delta. The model's other special
tokens (``special_tokens``) are dropped from the text, as vLLM drops every special token its
grammar does not know.

One known difference, in a reasoning parser chained to a tool parser: vLLM hands the tool
parser the delta that ended reasoning with only the token ids after that delta's last
reasoning-end marker, so when such a delta holds more reasoning markers after the end (say
``<|tool_call>`` then ``<channel|>`` in one delta), the markers before the last one are plain
text to vLLM's tool parser but markers to ours. Token-by-token streams never do this.
"""
