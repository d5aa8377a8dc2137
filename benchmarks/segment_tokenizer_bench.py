"""CPU per chat prompt tokenized: the plain `encode_batch_fast` call vs `SegmentTokenizer`.

    python -m benchmarks.segment_tokenizer_bench [--requests N] [--rounds R]

Workloads, rendered by the gateway's ChatRenderer with the tiny Qwen text model's template and
tokenizer (engine_server.tiny_models "text"):

* chat: `benchmarks.workloads` `chat` bodies, every request different (a recurring system
  prompt or none, 0-3 random earlier turns, a last user message of mixed length);
* conversations: the same bodies grown turn by turn, each request resending its conversation
  so far (4 conversations interleaved), as a multi-turn client does;
* tools: the `chat` bodies with the same 8 tool definitions every request (an agent's
  requests: the template writes them into a ~3 kB system block).

Each stream is tokenized in order by a fresh SegmentTokenizer (so its misses count) and by the
plain call; CPU time (time.process_time) over the stream, best of R rounds (the variants alternate),
per request. The
ids are checked equal first. `render` is the whole ChatRenderer.render (template + ids).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from benchmarks.workloads import varied_messages
from engine_server.tiny_models import ensure_model
from gateway.render.model_files import ModelFiles
from gateway.render.renderer import ChatRenderer, token_ids
from gateway.render.segment_tokenizer import SegmentTokenizer


def chat_stream(count: int) -> list[list[dict]]:
    return [varied_messages(seed) for seed in range(count)]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{n}_{verb}",
            "description": f"{verb.capitalize()} the {noun} named by the user; returns JSON with "
            f"the {noun}'s fields, or an error message when no such {noun} exists.",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": f"The {noun}'s name."},
                    "limit": {"type": "integer", "description": "At most this many results."},
                },
                "required": ["name"],
            },
        },
    }
    for n, (verb, noun) in enumerate(
        [("find", "file"), ("read", "page"), ("list", "user"), ("delete", "ticket")] * 2
    )
]


def conversation_stream(count: int, parallel: int = 4) -> list[list[dict]]:
    """Requests of `parallel` interleaved conversations; each request is its conversation so
    far plus a new user turn, and the reply is appended before its next turn."""
    conversations: list[list[dict]] = [[] for _ in range(parallel)]
    out = []
    for n in range(count):
        which = n % parallel
        conv = conversations[which]
        turn = varied_messages(10_000 + n)
        if not conv:
            conv.extend(m for m in turn if m["role"] == "system")
        if len(conv) > 24:  # a new conversation once this one is long
            conv[:] = [m for m in conv if m["role"] == "system"]
        conv.append(turn[-1])
        out.append(list(conv))
        conv.append({"role": "assistant", "content": turn[-1]["content"][:400] + " ok."})
    return out


def cpu_per_call(runs: list[Callable[[], None]], calls: int, rounds: int) -> list[float]:
    """Best CPU time per call of each run; the runs alternate round by round, so load from
    anything else on the machine hits them alike."""
    best = [float("inf")] * len(runs)
    for _ in range(rounds):
        for i, run in enumerate(runs):
            start = time.process_time()
            run()
            best[i] = min(best[i], time.process_time() - start)
    return [b / calls for b in best]


def bench(
    renderer: ChatRenderer,
    name: str,
    stream: list[list[dict]],
    rounds: int,
    tools: list[dict] | None = None,
) -> None:
    tokenizer = renderer.tokenizer
    prompts = [renderer.render(messages, tools=tools).prompt for messages in stream]
    check = SegmentTokenizer(tokenizer)
    for prompt in prompts:
        assert check.encode(prompt) == token_ids(tokenizer, prompt, False)

    def plain() -> None:
        for prompt in prompts:
            token_ids(tokenizer, prompt, False)

    def segments() -> None:
        seg = SegmentTokenizer(tokenizer)  # fresh: the stream's misses count
        for prompt in prompts:
            seg.encode(prompt)

    def render_with(encode: Callable[[str, bool], list[int]] | None) -> Callable[[], None]:
        def run() -> None:
            renderer.segments = SegmentTokenizer(tokenizer)
            if encode is not None:
                renderer.segments.encode = encode  # type: ignore[method-assign]
            for messages in stream:
                renderer.render(messages, tools=tools)

        return run

    n = len(prompts)
    chars = sum(map(len, prompts)) / n
    tokens = sum(len(token_ids(tokenizer, p, False)) for p in prompts) / n
    old_render = render_with(lambda text, special: token_ids(tokenizer, text, special))
    before, after, render_before, render_after = cpu_per_call(
        [plain, segments, old_render, render_with(None)], n, rounds
    )
    print(
        f"{name:14} {n:6} {chars:8.0f} {tokens:7.0f} "
        f"{before * 1e6:9.1f} {after * 1e6:9.1f} {before / after:6.2f}x "
        f"{render_before * 1e6:10.1f} {render_after * 1e6:10.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    renderer = ChatRenderer(ModelFiles.load(ensure_model("text")))
    assert renderer.segments.qualifies, renderer.segments.reason
    print("CPU per request (us), tokenizing the rendered prompt; render = template + ids")
    print(
        f"{'workload':14} {'reqs':>6} {'chars':>8} {'tokens':>7} "
        f"{'plain':>9} {'segment':>9} {'gain':>7} {'render old':>10} {'render new':>10}"
    )
    bench(renderer, "chat", chat_stream(args.requests), args.rounds)
    bench(renderer, "conversations", conversation_stream(args.requests), args.rounds)
    bench(renderer, "tools", chat_stream(args.requests), args.rounds, TOOLS)


if __name__ == "__main__":
    main()
