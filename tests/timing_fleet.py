"""Three llama-server processes serving the timing model, multi-turn sessions, concurrent clients, and
the placements compared on them: shared by ``tests/integration/test_timing_routing.py`` and
``benchmarks/real_routing.py``.

The timing model (``tools/build_timing_model.py``) prefills at about 150 tokens a second per engine
thread on this class of machine, so a prompt the engine must prefill in full costs seconds and one it
finds in a slot costs only its new tail. Each engine keeps only what its slots hold (``--cache-ram 0``,
no host-memory prompt cache): placement alone decides what is reused.

Every placement runs on freshly started engines (and a fresh gateway), on the same sessions: the same
prompts, so the same work, and answers that can be compared request by request (at temperature 0,
without flash attention, llama-server's greedy answers on CPU do not depend on what was cached or
batched beside them; the test checks it on every request). Reused prompt tokens are the engines' own counters.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx
import openai

from tests.conftest import GatewayProcess, write_config
from tests.contract.engines import llama_server
from tools.build_timing_model import timing_model

MODEL = "enginegate-timing"
ENGINES = 3
SLOTS = 3
"""Slots per engine: nine in all, for the eight sessions below."""
SLOT_CONTEXT = 4096
_VOCABULARY = (
    "the tool returned status file line error request cache engine server client session value config "
    "build test result output input path name time token model prefix route queue slot batch memory "
    "thread index block hash read write open close start stop retry check table row column report"
)
WORDS = _VOCABULARY.split()
POLICIES = ("enginegate", "round_robin", "least_busy", "cache_aware")


@dataclass(frozen=True)
class Workload:
    """Tool-calling sessions: a shared system preamble, a per-session task, then turns that each add a
    tool call (a fixed assistant message, so every run's prompts are the same whatever the model says)
    and the tool's output. Sizes in words, of about four of the demo tokenizer's tokens each: by default a
    70-token preamble and prompts of about 210, 370, 510 and 650 tokens, some 14,000 prompt tokens a run.
    Eight sessions fit the three engines' nine slots only if each stays where it began; an engine that
    sees every session (round robin) keeps each one's history only by chance."""

    sessions: int = 8
    turns: int = 4
    preamble_words: int = 8
    opening_words: int = 30
    turn_words: int = 25
    max_tokens: int = 8
    seed: int = 24
    budget_ms: int = 5000
    """The first-token budget every request states (``x-ttft-budget-ms``): met by a turn whose history
    the engine holds, missed by one that prefills the whole session on a busy engine."""


def _text(rng: random.Random, words: int) -> str:
    return " ".join(
        f"{rng.choice(WORDS)}={rng.randrange(100)}" if i % 4 == 3 else rng.choice(WORDS) for i in range(words)
    )


def sessions(w: Workload) -> list[list[list[dict[str, str]]]]:
    """``[session][turn]`` -> the messages of that request."""
    rng = random.Random(w.seed)
    preamble = "You are a build agent. Use the tools, one call per turn. Rules: " + _text(rng, w.preamble_words)
    out = []
    for s in range(w.sessions):
        history = [
            {"role": "system", "content": preamble},
            {"role": "user", "content": f"Task {s}: " + _text(rng, w.opening_words)},
        ]
        turns = []
        for t in range(w.turns):
            if t:
                call = f'<tool_call>{{"name": "run", "arguments": {{"session": {s}, "step": {t}}}}}</tool_call>'
                history.append({"role": "assistant", "content": call})
                out_text = _text(rng, w.turn_words)
                history.append({"role": "user", "content": f"<tool_response>{out_text}</tool_response>"})
            turns.append(list(history))
        out.append(turns)
    return out


def prompt_text(messages: Sequence[dict[str, str]]) -> str:
    return "".join(f"{m['role']}\0{m['content']}\0" for m in messages)


@dataclass
class Target:
    url: str
    engine: int | None
    """The engine a client-side placement chose; None through the gateway (its answer names it)."""
    headers: dict[str, str] = field(default_factory=dict)


class Placement(Protocol):
    name: str

    def open(self, position: int, text: str) -> Target:
        """``position``: the request's place in ``schedule``."""
        ...

    def close(self, target: Target) -> None: ...


class _ClientSide:
    """Client-side placements: each counts its own requests in flight per engine."""

    name = ""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self.in_flight = [0] * len(urls)
        self.lock = threading.Lock()

    def choose(self, position: int, text: str) -> int:
        raise NotImplementedError

    def open(self, position: int, text: str) -> Target:
        with self.lock:
            i = self.choose(position, text)
            self.in_flight[i] += 1
        return Target(self.urls[i], i)

    def close(self, target: Target) -> None:
        assert target.engine is not None
        with self.lock:
            self.in_flight[target.engine] -= 1


class RoundRobin(_ClientSide):
    """Round robin over the requests in their scheduled order, not their arrival order: concurrent
    clients that happen to move in step make arrival-order round robin sticky by accident (two runs
    of the same three-client workload reused 3,244 and 5,171 prompt tokens), and a baseline that
    varies with timing cannot anchor a ratio."""

    name = "round_robin"

    def choose(self, position: int, text: str) -> int:
        return position % len(self.urls)


class LeastBusy(_ClientSide):
    """Fewest requests in flight; ties go to the engine picked longest ago (else one client at a time
    would send everything to the first engine)."""

    name = "least_busy"

    def __init__(self, urls: Sequence[str]) -> None:
        super().__init__(urls)
        self.last = [-1] * len(urls)
        self.picks = 0

    def choose(self, position: int, text: str) -> int:
        i = min(range(len(self.urls)), key=lambda j: (self.in_flight[j], self.last[j]))
        self.picks += 1
        self.last[i] = self.picks
        return i


class CacheAware(_ClientSide):
    """A cache-aware baseline after SGLang's router, with its defaults: per engine the prompt texts
    sent there (the longest match over them is what its approximate radix tree answers); when the
    load is imbalanced (max - min in flight above 32 and max above 1.0001 x min) the least loaded
    engine, else the engine with the longest match if it covers more than half the prompt, else the
    engine that holds the least text. Nothing is evicted (a run sends far less than an engine holds)."""

    name = "cache_aware"
    THRESHOLD = 0.5
    BALANCE_ABS = 32
    BALANCE_REL = 1.0001

    def __init__(self, urls: Sequence[str]) -> None:
        super().__init__(urls)
        self.sent: list[list[str]] = [[] for _ in urls]

    def choose(self, position: int, text: str) -> int:
        engines = range(len(self.urls))
        low, high = min(self.in_flight), max(self.in_flight)
        if high - low > self.BALANCE_ABS and high > self.BALANCE_REL * low:
            i = min(engines, key=lambda j: self.in_flight[j])
        else:
            matched = [max((common_prefix(text, t) for t in self.sent[j]), default=0) for j in engines]
            best = max(engines, key=lambda j: (matched[j], -self.in_flight[j]))
            if matched[best] > self.THRESHOLD * len(text):
                i = best
            else:
                i = min(engines, key=lambda j: (sum(map(len, self.sent[j])), self.in_flight[j]))
        self.sent[i].append(text)
        return i


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix, by bisection on slices compared in C."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class ThroughGateway:
    name = "enginegate"

    def __init__(self, gateway_url: str, budget_ms: int) -> None:
        self.url = gateway_url
        self.budget = {"x-ttft-budget-ms": str(budget_ms)}

    def open(self, position: int, text: str) -> Target:
        return Target(self.url, None, self.budget)

    def close(self, target: Target) -> None:
        pass


@dataclass(frozen=True)
class Answer:
    session: int
    turn: int
    engine: int
    text: str
    ttft_s: float


def _ask(client: openai.OpenAI, w: Workload, target: Target, messages: list[dict[str, str]]) -> tuple[str, float, str]:
    """(answer, seconds to its first token, the backend the gateway named) of one streamed request."""
    start = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=w.max_tokens,
        temperature=0,
        stream=True,
        extra_headers=target.headers,
    )
    first: float | None = None
    parts = []
    stream = raw.parse()
    assert isinstance(stream, openai.Stream)
    for chunk in stream:
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            first = first if first is not None else time.monotonic() - start
            parts.append(delta)
    ttft = first if first is not None else time.monotonic() - start  # an empty answer: its end
    return "".join(parts), ttft, raw.headers.get("x-enginegate-backend", "")


def schedule(w: Workload) -> list[tuple[int, int]]:
    """Every request as ``(session, turn)`` in one seeded order: turn by turn, sessions shuffled."""
    rng = random.Random(w.seed)
    return [(s, t) for t in range(w.turns) for s in rng.sample(range(w.sessions), w.sessions)]


def drive(placement: Placement, w: Workload, clients: int) -> list[Answer]:
    """``clients`` concurrent clients; client ``c`` owns sessions ``c, c + clients, ...`` and sends
    their requests in the order of ``schedule``."""
    requests = sessions(w)
    order = schedule(w)
    answers: list[Answer] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(c: int) -> None:
        with openai.OpenAI(base_url="http://unused/v1", api_key="none", max_retries=0, timeout=900) as api:
            for position, (s, turn) in enumerate(order):
                if s % clients == c:
                    messages = requests[s][turn]
                    target = placement.open(position, prompt_text(messages))
                    try:
                        text, ttft, named = _ask(api.with_options(base_url=f"{target.url}/v1"), w, target, messages)
                    finally:
                        placement.close(target)
                    engine = target.engine if target.engine is not None else int(named.rpartition("-")[2])
                    with lock:
                        answers.append(Answer(s, turn, engine, text, ttft))

    def guarded(c: int) -> None:
        try:
            client(c)
        except BaseException as exc:  # re-raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sorted(answers, key=lambda a: (a.session, a.turn))


def engine_counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^llamacpp:(\w+) (\S+)$", text, re.M)}


@contextmanager
def timing_engines(workdir: Path, n: int = ENGINES) -> Iterator[list[str]]:
    """``n`` fresh llama-servers on the timing model (built first when absent)."""
    model = timing_model()
    args: tuple[str, ...] = ("-m", str(model), "--alias", MODEL, "-np", str(SLOTS), "-c", str(SLOTS * SLOT_CONTEXT))
    args += ("--cache-ram", "0", "--slot-prompt-similarity", "0.5")  # a slot serves prompts sharing half its own
    # Flash attention (which "auto" turns on) makes a greedy answer depend on the prompts prefilled beside
    # it (measured: one of three prompts prefilled together answered otherwise than alone); without it,
    # every answer is the same alone, batched, from a cached prefix or not.
    args += ("--flash-attn", "off")
    with ExitStack() as stack:
        dirs = [workdir / f"engine-{i}" for i in range(n)]
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
        yield [stack.enter_context(llama_server(d, *args)) for d in dirs]


@contextmanager
def timing_gateway(workdir: Path, urls: Sequence[str]) -> Iterator[GatewayProcess]:
    backends = "\n".join(
        f'  - {{name: llama-{i}, engine: llama_server, model: {MODEL}, url: "{u}", max_concurrency: {SLOTS}}}'
        for i, u in enumerate(urls)
    )
    config = write_config(
        workdir / "timing.yaml", f'models:\n  - {{name: {MODEL}, gguf: "{timing_model()}"}}\nbackends:\n{backends}\n'
    )
    proc = GatewayProcess(config, workdir / "cache")
    try:
        yield proc
    finally:
        proc.stop()


@dataclass(frozen=True)
class Run:
    """One placement's run: what the engines counted and what the clients saw."""

    policy: str
    clients: int
    answers: list[Answer]
    counters: list[dict[str, float]]
    budget_ms: int

    @property
    def reused(self) -> int:
        return int(sum(c["prompt_tokens_cached_total"] for c in self.counters))

    @property
    def prefilled(self) -> list[int]:
        return [int(c["prompt_tokens_total"]) for c in self.counters]

    @property
    def requests(self) -> list[int]:
        placed = Counter(a.engine for a in self.answers)
        return [placed[i] for i in range(len(self.counters))]

    @property
    def sessions_per_engine(self) -> list[int]:
        """Sessions whose first turn each engine answered."""
        began = Counter(a.engine for a in self.answers if a.turn == 0)
        return [began[i] for i in range(len(self.counters))]

    @property
    def moves(self) -> int:
        """Turns sent to another engine than the session's previous turn."""
        by = {(a.session, a.turn): a.engine for a in self.answers}
        return sum(1 for (s, t), e in by.items() if t and by[(s, t - 1)] != e)

    def ttft(self, q: float) -> float:
        values = sorted(a.ttft_s for a in self.answers)
        return values[max(0, math.ceil(q * len(values)) - 1)]

    @property
    def met(self) -> float:
        return sum(a.ttft_s * 1000 <= self.budget_ms for a in self.answers) / len(self.answers)

    def row(self) -> dict[str, float | int | str]:
        prompt = self.reused + sum(self.prefilled)
        return {
            "policy": self.policy,
            "clients": self.clients,
            "reused_tokens": self.reused,
            "reused_share": round(self.reused / prompt, 3),
            "prefilled_tokens": sum(self.prefilled),
            "ttft_p50_s": round(self.ttft(0.5), 2),
            "ttft_p99_s": round(self.ttft(0.99), 2),
            "budget_met": round(self.met, 3),
            "moves": self.moves,
            "requests_max_over_mean": round(max(self.requests) * len(self.requests) / sum(self.requests), 2),
            "prefill_max_over_mean": round(max(self.prefilled) * len(self.prefilled) / max(1, sum(self.prefilled)), 2),
        }


def run_policy(policy: str, w: Workload, clients: int, workdir: Path) -> Run:
    """One placement on freshly started engines (and gateway): nothing cached from another run."""
    workdir.mkdir(parents=True, exist_ok=True)
    with timing_engines(workdir) as urls, ExitStack() as stack:
        placement: Placement
        if policy == "enginegate":
            gateway = stack.enter_context(timing_gateway(workdir, urls))
            placement = ThroughGateway(gateway.base_url, w.budget_ms)
        else:
            kinds: dict[str, type[_ClientSide]] = {c.name: c for c in (RoundRobin, LeastBusy, CacheAware)}
            placement = kinds[policy](urls)
        answers = drive(placement, w, clients)
        return Run(policy, clients, answers, [engine_counters(u) for u in urls], w.budget_ms)
