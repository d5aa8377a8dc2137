"""Send each image once (issue 29): a three-turn chat resending two images through `mmgate
serve` and our worker (its item cache on at vLLM's default --mm-processor-cache-gb) answers
as vLLM's own server does, token for token with logprobs, while turns 2 and 3 leave out
every image's tensors (gateway metrics: every item left out, so no pixel byte sent). A
flushed worker cache (FlushCache, as after a restart) costs one resend and the same answer.
Two gateways in front of the one worker, alternating turns of one chat, each send the
images once and then hit (each has its own partition of the worker's cache).
On the API pair's vision engines (session scope): no engine of its own."""

from __future__ import annotations

import httpx

from protos import common_pb2
from tests.support.e2e_cases import make_image
from tests.support.family_e2e import REFERENCE_NAME, data_uri
from tests.support.gateway_process import GatewayProcess
from tests.support.video_e2e import assert_same_answer

# Qwen2-VL's 640x480 + 1280x960 pair, scaled down to fit the tiny model's 2048 tokens.
IMAGES = [make_image(112, 84, seed=2901), make_image(224, 168, seed=2902)]
QUESTIONS = ["Describe both.", "And the second?", "Compare them."]


def metrics(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("mmgate_mm_send_once_") and "_total " in line:
            name, value = line.split()
            values[name.removeprefix("mmgate_mm_send_once_").removesuffix("_total")] = float(value)
    return values


def chat(url: str, model: str, messages: list) -> httpx.Response:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "ignore_eos": True,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def test_a_chat_resending_two_images_sends_them_once_and_equals_vllm(vision_stack):
    ours, model = vision_stack.mmgate_url, str(vision_stack.model)
    images = [{"type": "image_url", "image_url": {"url": data_uri(i)}} for i in IMAGES]
    messages: list = []
    deltas = []

    def turn(question: str | None) -> None:
        if question is not None:
            content = [*images, {"type": "text", "text": question}] if not messages else question
            messages.append({"role": "user", "content": content})
        before = metrics(ours)
        want = chat(vision_stack.vllm_url, REFERENCE_NAME, messages)
        got = chat(ours, model, messages)
        assert_same_answer(got, want)
        after = metrics(ours)
        deltas.append({k: after[k] - before.get(k, 0.0) for k in after})
        if question is not None:
            reply = want.json()["choices"][0]["message"]["content"]
            messages.append({"role": "assistant", "content": reply})

    for question in QUESTIONS:
        turn(question)
    messages.pop()  # the last reply: turn 4 asks the third question again
    assert deltas[0]["hits"] == 0 and deltas[0]["resends"] == 0
    for delta in deltas[1:]:  # both images left out: no pixel byte sent
        assert delta["hits"] == 2 and delta["bytes_saved"] > 2 * 3 * 84 * 112
        assert delta["resends"] == 0

    # The worker forgets every item (as a restarted one would): one resend, the same answer.
    vision_stack.worker.stub().FlushCache(common_pb2.FlushCacheRequest(), timeout=30)
    turn(None)
    assert deltas[-1]["resends"] == 1 and deltas[-1]["hits"] == 0
    turn(None)
    assert deltas[-1]["resends"] == 0 and deltas[-1]["hits"] == 2  # kept again by the resend


def test_two_gateways_alternating_turns_each_send_the_images_once(vision_stack, tmp_path):
    """Each gateway process is a sender with its own partition of the worker's cache, whose
    share is what it mirrors: the second one's keeps neither evict the first one's items nor
    make it miss. (Far below the bound here: the unit tests, tests/unit/gateway/workers/
    test_send_once*.py, are where senders contend for room.)"""
    model = str(vision_stack.model)
    other = GatewayProcess(
        vision_stack.model, [vision_stack.worker.address], tmp_path / "gw2.log"
    ).wait_ready()
    try:
        gateways = [vision_stack.mmgate_url, other.base_url]
        pair = [make_image(168, 112, seed=2911), make_image(112, 140, seed=2912)]
        images = [{"type": "image_url", "image_url": {"url": data_uri(i)}} for i in pair]
        messages: list = [{"role": "user", "content": [*images, {"type": "text", "text": "Hi"}]}]
        deltas = []
        for number in range(5):
            url = gateways[number % 2]
            before = metrics(url)
            want = chat(vision_stack.vllm_url, REFERENCE_NAME, messages)
            assert_same_answer(chat(url, model, messages), want)
            after = metrics(url)
            deltas.append({k: after[k] - before.get(k, 0.0) for k in after})
            reply = want.json()["choices"][0]["message"]["content"]
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": f"And now? ({number})"},
            ]
        assert [d["hits"] for d in deltas] == [0, 0, 2, 2, 2]  # each sends them once
        assert all(d["resends"] == 0 for d in deltas)
        # Each mirrors its own partition: a share of vLLM's default 4 GiB, one of 4 senders.
        views = [httpx.get(f"{url}/admin/workers", timeout=10).json() for url in gateways]
        mirrors = [view["workers"][0]["mm_item_cache"] for view in views]
        assert [m["max_bytes"] for m in mirrors] == [(4 << 30) // 4] * 2
        assert mirrors[1]["items"] == 2  # the second gateway's: the pair it sent
    finally:
        other.stop()
