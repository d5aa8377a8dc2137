"""Workers that break mid-stream: the client gets an error, never a truncated success or a hang."""

from __future__ import annotations

import openai
import pytest

from tests.support.fake_worker import FakeWorker
from tests.support.gateway_process import GatewayProcess

MESSAGES = [{"role": "user", "content": "hi"}]
TOKENS = [300, 301, 302, 303]


@pytest.fixture(params=["truncate", "abort"])
def broken(request, text_model, tmp_path):
    worker = FakeWorker(text_model, TOKENS, ending=request.param)
    gateway = GatewayProcess(text_model, [worker.address], tmp_path / "gw.log").wait_ready()
    yield request.param, gateway
    gateway.stop()
    worker.stop()


def test_a_broken_stream_is_an_error(broken):
    ending, gateway = broken
    client = gateway.client()
    with pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model=client.models.list().data[0].id, messages=MESSAGES)
    expected = 502 if ending == "truncate" else 503
    assert raised.value.status_code == expected
    events = list(
        client.chat.completions.with_streaming_response.create(
            model=client.models.list().data[0].id, messages=MESSAGES, stream=True
        )
        .__enter__()
        .iter_lines()
    )
    data = [line for line in events if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert '"error"' in data[-2], data[-3:]
    assert not any('"finish_reason": "length"' in line for line in data)


def test_a_well_behaved_fake_streams_normally(text_model, tmp_path):
    """The fake itself is sound: with its Complete the same request succeeds."""
    worker = FakeWorker(text_model, TOKENS, ending="complete")
    gateway = GatewayProcess(text_model, [worker.address], tmp_path / "gw.log").wait_ready()
    try:
        client = gateway.client()
        reply = client.chat.completions.create(
            model=client.models.list().data[0].id, messages=MESSAGES
        )
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage.completion_tokens == len(TOKENS)
    finally:
        gateway.stop()
        worker.stop()
