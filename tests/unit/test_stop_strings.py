"""Stop strings on streamed text: the same cuts as a naive matcher, in time linear in the text."""

from __future__ import annotations

import random
import time

from backends.text import StopStrings


class NaiveStops:
    """The obvious quadratic matcher, as the reference: search the whole held text for every stop, and
    hold back the longest tail that is a proper prefix of some stop."""

    def __init__(self, stop: list[str]) -> None:
        self.stop = [s for s in stop if s]
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        self.held += text
        hits = [i for i in (self.held.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            out, self.held = self.held[: min(hits)], ""
            return out
        keep = max((k for s in self.stop for k in range(1, len(s)) if self.held.endswith(s[:k])), default=0)
        out, self.held = self.held[: len(self.held) - keep], self.held[len(self.held) - keep :]
        return out

    def flush(self) -> str:
        out, self.held = ("" if self.stopped else self.held), ""
        return out


def run(stops: StopStrings | NaiveStops, chunks: list[str]) -> list[str]:
    sent = []
    for chunk in chunks:
        sent.append(stops.feed(chunk))
        if stops.stopped:
            return sent
    return [*sent, stops.flush()]


def test_each_feed_sends_what_the_naive_matcher_sends() -> None:
    rng = random.Random(12)
    # A small alphabet makes stops that overlap themselves and each other, spanning chunk boundaries.
    for _ in range(3000):
        alphabet = "ab" if rng.random() < 0.5 else "abc"
        stops = ["".join(rng.choices(alphabet, k=rng.randint(0, 6))) for _ in range(rng.randint(0, 4))]
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 40)))
        chunks, i = [], 0
        while i < len(text):
            n = rng.randint(0, 5)
            chunks.append(text[i : i + n])
            i += n
        assert run(StopStrings(stops), chunks) == run(NaiveStops(stops), chunks), (stops, chunks)


def test_periodic_stops_whose_partial_match_must_fall_back() -> None:
    stops = ["aab", "abab" * 3 + "c"]
    chunks = list("aaab" + "abab" * 5 + "ababc" + "x")
    assert run(StopStrings(stops), chunks) == run(NaiveStops(stops), chunks)
    assert "".join(run(StopStrings(["ababc"]), ["ab", "aba", "bc", "zz"])) == "ab"


def test_a_stop_inside_one_chunk_and_one_spanning_chunks_cut_at_the_earliest_start() -> None:
    stops = StopStrings(["bcd", "xabcdef"])
    assert stops.feed("..xa") == ".."
    assert stops.feed("bcdef") == ""  # "xabcdef" began first
    assert stops.stopped


def test_long_stops_cost_linear_time() -> None:
    # Four 100 KB stops and a generation that keeps almost matching them: the quadratic matcher took
    # 0.4 s per feed; a linear one does all of it in milliseconds.
    stops = ["a" * 100_000 + str(i) for i in range(4)]
    matcher = StopStrings(stops)
    deadline = time.perf_counter() + 0.5
    sent = []
    for n in range(100):
        sent.append(matcher.feed("a" * 1000))
        assert time.perf_counter() < deadline, f"{n + 1} feeds took over 0.5 s"
    sent.append(matcher.feed("b"))
    assert sent[:-1] == [""] * 100  # everything may still become a stop
    assert sent[-1] == "a" * 100_000 + "b" and not matcher.stopped
    assert matcher.feed("a" * 100_000 + "3") == "" and matcher.stopped
