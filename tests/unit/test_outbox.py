"""Writes held until the loop's turn ends (``backends.httpclient.outbox``): when they go, in what order,
and what happens to them when their transport closes first."""

from __future__ import annotations

import asyncio
from typing import Any

from backends.httpclient.outbox import Held, Outbox


class Wire:
    """What transports did, in the order they did it, across all of them."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, bytes]] = []


class FakeTransport:
    def __init__(self, name: str, wire: Wire, break_on_write: bool = False) -> None:
        self.name = name
        self.wire = wire
        self.closing = False
        self.break_on_write = break_on_write

    def write(self, data: bytes) -> None:
        if self.break_on_write:  # as uvloop does when the send fails: closes, tells its protocol later
            self.closing = True
            return
        self.wire.log.append((self.name, "write", data))

    def close(self) -> None:
        self.closing = True
        self.wire.log.append((self.name, "close", b""))

    def abort(self) -> None:
        self.closing = True
        self.wire.log.append((self.name, "abort", b""))

    def write_eof(self) -> None:
        self.wire.log.append((self.name, "eof", b""))

    def is_closing(self) -> bool:
        return self.closing


class Sender:
    def __init__(self) -> None:
        self.unsent_calls = 0

    def unsent(self) -> None:
        self.unsent_calls += 1


def run(body: Any) -> Any:
    return asyncio.run(asyncio.wait_for(body(), 10))


def test_writes_wait_for_the_turn_to_end_and_keep_their_order() -> None:
    async def body() -> None:
        wire = Wire()
        outbox = Outbox(asyncio.get_running_loop())
        a, b = FakeTransport("a", wire), FakeTransport("b", wire)
        outbox.write(a, b"1", None, False)  # type: ignore[arg-type]
        outbox.write(b, b"2", None, True)  # type: ignore[arg-type]  # alone, but something is held
        outbox.write(a, b"3", None, False)  # type: ignore[arg-type]
        assert wire.log == []
        await asyncio.sleep(0)
        assert wire.log == [("a", "write", b"1"), ("b", "write", b"2"), ("a", "write", b"3")]

    run(body)


def test_a_writer_alone_writes_at_once() -> None:
    async def body() -> None:
        wire = Wire()
        outbox = Outbox(asyncio.get_running_loop())
        outbox.write(FakeTransport("a", wire), b"1", None, True)  # type: ignore[arg-type]
        assert wire.log == [("a", "write", b"1")]

    run(body)


def test_closing_or_ending_a_held_transport_sends_what_is_held_first() -> None:
    async def body() -> None:
        wire = Wire()
        outbox = Outbox(asyncio.get_running_loop())
        tasks = [object(), object()]  # two requests in flight: writes are held
        a, b = FakeTransport("a", wire), FakeTransport("b", wire)
        held_a, held_b = Held(a, outbox, tasks), Held(b, outbox, tasks)  # type: ignore[arg-type]
        held_a.write(b"head")
        held_b.write(b"other")
        held_a.close()
        held_b.write(b"answer")
        held_b.write_eof()
        assert wire.log == [
            ("a", "write", b"head"), ("a", "close", b""), ("b", "write", b"other"), ("b", "write", b"answer"),
            ("b", "eof", b""),
        ]  # fmt: skip
        await asyncio.sleep(0)
        assert len(wire.log) == 5  # nothing sent twice

    run(body)


def test_a_held_write_that_cannot_go_tells_its_sender() -> None:
    async def body() -> None:
        wire = Wire()
        outbox = Outbox(asyncio.get_running_loop())
        closed, breaking, fine = FakeTransport("c", wire), FakeTransport("x", wire, True), FakeTransport("f", wire)
        senders = [Sender(), Sender(), Sender()]
        for transport, sender in zip((closed, breaking, fine), senders, strict=True):
            outbox.write(transport, b"request", sender, False)  # type: ignore[arg-type]
        closed.abort()  # the connection was lost while its request was held
        await asyncio.sleep(0)
        assert [s.unsent_calls for s in senders] == [1, 1, 0]
        assert wire.log == [("c", "abort", b""), ("f", "write", b"request")]
        # Alone, the same is said at once.
        alone = Sender()
        outbox.write(FakeTransport("y", wire, True), b"request", alone, True)  # type: ignore[arg-type]
        assert alone.unsent_calls == 1

    run(body)


def test_a_transport_that_raises_on_write_is_aborted_and_the_rest_still_go() -> None:
    class Raising(FakeTransport):
        def write(self, data: bytes) -> None:
            raise RuntimeError("broken")

    async def body() -> None:
        wire = Wire()
        outbox = Outbox(asyncio.get_running_loop())
        outbox.write(Raising("r", wire), b"1", None, False)  # type: ignore[arg-type]
        outbox.write(FakeTransport("f", wire), b"2", None, False)  # type: ignore[arg-type]
        await asyncio.sleep(0)
        assert wire.log == [("r", "abort", b""), ("f", "write", b"2")]

    run(body)
