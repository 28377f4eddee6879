"""The SSE reader on the framings engines really send, cut at every byte boundary."""

from __future__ import annotations

import pytest

from backends.sse import Event, EventParser

STREAMS = [
    # vLLM / OpenAI
    (b'data: {"a":1}\n\ndata: [DONE]\n\n', [Event('{"a":1}'), Event("[DONE]")]),
    # TGI: no space after the colon, keep-alive comments
    (b':\n\ndata:{"token":"\xc3\xa9"}\n\n:\n\n', [Event('{"token":"\xe9"}')]),
    # CRLF line ends, multi-line data
    (b"data: one\r\ndata: two\r\n\r\n", [Event("one\ntwo")]),
    # older llama-server: a non-standard error field
    (b'error: {"code":400}\n\n', [Event('{"code":400}', "error")]),
    # the connection closes without the final blank line
    (b'data: {"last":true}', [Event('{"last":true}')]),
    # fields we do not use are ignored
    (b"event: ping\nid: 7\nretry: 10\ndata: x\n\n", [Event("x")]),
]


def parse(chunks: list[bytes]) -> list[Event]:
    parser = EventParser()
    out = [e for c in chunks for e in parser.feed(c)]
    return out + list(parser.close())


@pytest.mark.parametrize(("raw", "events"), STREAMS)
def test_events_are_the_same_whatever_the_network_chunking(raw: bytes, events: list[Event]) -> None:
    assert parse([raw]) == events
    for cut in range(1, len(raw)):
        assert parse([raw[:cut], raw[cut:]]) == events, cut
    assert parse([raw[i : i + 1] for i in range(len(raw))]) == events
