"""The extra headers an attempt sends its engine (the trace context) become header lines only when they
cannot break one: a value with a line break or a name with a colon is left out, never sent mangled."""

from __future__ import annotations

from backends.engine_http import header_lines


def test_headers_become_lines_and_those_that_would_break_one_are_left_out() -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert header_lines({"traceparent": parent}) == b"traceparent: " + parent.encode() + b"\r\n"
    bad = {"x-a": "one\r\nx-injected: yes", "x:b": "v", "x c": "v", "": "v", "x-d": "caf\u00e9"}
    assert header_lines(bad) == b""
    assert header_lines({}) == b""
