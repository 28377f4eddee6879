"""Every adapter under test, real where the engine runs here and a contract fake otherwise.

A ``Subject`` makes fresh backends (one per test: httpx pools and asyncio
primitives belong to one event loop), reads the engine's own count of
generated tokens, and, for fakes, holds the fault control.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from backends.base import Backend, ErrorKind
from backends.ctranslate2_engine import CTranslate2Backend
from backends.deepspeed_mii import MiiOpenAIBackend, MiiRestBackend
from backends.http_base import HttpSettings
from backends.llama_server import LlamaServerBackend
from backends.llamacpp_engine import LlamaCppBackend
from backends.tgi import TgiBackend
from backends.tgi_messages import TgiMessagesBackend
from backends.trtllm import TritonTrtllmBackend, TrtllmServeBackend
from backends.vllm import VLLMBackend
from tests.conftest import DEMO_GGUF, free_port
from tests.contract import fake_mii, fake_tgi, fake_triton, fake_trtllm_serve
from tests.contract.control import FakeControl
from tests.contract.engines import SERVED
from tests.contract.tiny_engine import TinyEngine
from tests.fakes import serve_in_thread

BackendMaker = Callable[..., Backend]


@dataclass
class Subject:
    name: str
    make: BackendMaker
    """make(url=None, read_timeout_s=None) -> a new backend of this kind."""
    engine_tokens: Callable[[], float]
    engine: TinyEngine | None = None
    control: FakeControl | None = None
    streams: bool = True
    """False: the engine answers whole (MII REST): one chunk."""
    streams_when_asked: bool | None = None
    """Whether a request whose client streams is streamed (default: ``streams``): Triton's ``whole``
    mode answers others whole and streams those."""
    exact_usage: bool = True
    """False: the engine reports no token counts and the adapter estimates or counts pieces."""
    faults: dict[str, ErrorKind] = field(default_factory=dict)
    """Fault names of the fake, each with the error kind the adapter must raise."""
    health_can_fail: bool = True
    context_error: ErrorKind | None = ErrorKind.CONTEXT_LENGTH
    """What an over-long prompt becomes: None where the engine answers anyway."""
    cancellable: bool = True
    """False: the engine has no way to stop a request (MII REST); only the connection is closed."""
    own_request_id: bool = False
    """The engine takes the request id in a field of its own (Triton's ``id``), recorded by the fake."""

    def __post_init__(self) -> None:
        if self.streams_when_asked is None:
            self.streams_when_asked = self.streams

    @property
    def fake(self) -> bool:
        return self.control is not None


def _metric(url: str, pattern: str) -> Callable[[], float]:
    def read() -> float:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        m = re.search(pattern, text, re.M)
        assert m, f"{pattern!r} not in metrics of {url}"
        return float(m.group(1))

    return read


def _http(cls: type, url: str, **extra: Any) -> BackendMaker:
    def make(url: str = url, read_timeout_s: float = 60.0) -> Backend:
        settings = HttpSettings(url=url, served_model=SERVED, read_timeout_s=read_timeout_s, default_max_tokens=64)
        backend: Backend = cls("under-test", SERVED, settings, **extra)
        return backend

    return make


PORTLESS = "http://127.0.0.1:{port}"


def closed_port_url() -> str:
    return PORTLESS.format(port=free_port())


@contextmanager
def subject(name: str, workdir: Path, real_engine: Callable[[str], str]) -> Iterator[Subject]:
    """Start what ``name`` needs (fake server) or take it from ``real_engine(name)`` (a running
    engine's URL, shared by the session) and describe it."""
    cache = workdir / "cache"
    with ExitStack() as stack:
        if name == "ctranslate2":
            made: list[CTranslate2Backend] = []

            def make_ct2(url: str | None = None, read_timeout_s: float = 0) -> Backend:
                made.append(CTranslate2Backend("under-test", SERVED, DEMO_GGUF, cache))
                return made[-1]

            yield Subject(name, make_ct2, lambda: sum(b.generated_tokens for b in made))
            return
        if name == "llama_cpp":
            made_l: list[LlamaCppBackend] = []

            def make_llama(url: str | None = None, read_timeout_s: float = 0) -> Backend:
                made_l.append(LlamaCppBackend("under-test", SERVED, DEMO_GGUF))
                return made_l[-1]

            yield Subject(name, make_llama, lambda: sum(b.generated_tokens for b in made_l))
            return
        if name == "vllm":
            url = real_engine(name)
            yield Subject(name, _http(VLLMBackend, url), _metric(url, r"^vllm:generation_tokens_total\{.*\} (\S+)$"))
            return
        if name == "llama_server":
            url = real_engine(name)
            yield Subject(name, _http(LlamaServerBackend, url), _metric(url, r"^llamacpp:n_decode_total (\S+)$"))
            return
        engine, control = TinyEngine(cache), FakeControl()
        tokens = lambda: float(engine.generated_tokens)  # noqa: E731
        if name in ("tgi", "tgi_messages"):
            url = stack.enter_context(serve_in_thread(fake_tgi.create_app(engine, control), "/health"))
            cls = TgiBackend if name == "tgi" else TgiMessagesBackend
            faults = {
                "overloaded": ErrorKind.OVERLOADED,
                "generation": ErrorKind.UPSTREAM,
                "incomplete": ErrorKind.UPSTREAM,
                "validation": ErrorKind.CONTEXT_LENGTH,  # the fake's validation fault is TGI's length check
                "overloaded_midstream": ErrorKind.OVERLOADED,
            }
            yield Subject(name, _http(cls, url), tokens, engine, control, faults=faults)
        elif name == "trtllm_serve":
            url = stack.enter_context(serve_in_thread(fake_trtllm_serve.create_app(engine, control), "/health"))
            faults = {
                "overloaded": ErrorKind.OVERLOADED,  # a 400 whose text says the queue is full
                "internal": ErrorKind.UPSTREAM,
                "midstream": ErrorKind.PROTOCOL,  # the connection drops after a few tokens
            }
            yield Subject(name, _http(TrtllmServeBackend, url), tokens, engine, control, faults=faults)
        elif name in ("triton_trtllm", "triton_bls"):
            url = stack.enter_context(serve_in_thread(fake_triton.create_app(engine, control), "/v2/health/ready"))
            faults = {
                "unavailable": ErrorKind.OVERLOADED,
                "internal": ErrorKind.UPSTREAM,
                "midstream": ErrorKind.UPSTREAM,  # an error event, then the stream ends (whole: a 500)
            }
            # The ensemble as deployed by default answers whole (its per-token stream loses spaces); the BLS
            # model with accumulate_tokens streams the text so far, which the adapter diffs.
            extra: dict[str, object] = (
                {} if name == "triton_trtllm" else {"triton_model": "tensorrt_llm_bls", "text_output": "cumulative"}
            )
            yield Subject(
                name,
                _http(TritonTrtllmBackend, url, **extra),
                tokens,
                engine,
                control,
                streams=name == "triton_bls",
                streams_when_asked=True,
                exact_usage=False,
                faults=faults,
                own_request_id=True,
            )
        elif name == "mii_rest":
            url = stack.enter_context(serve_in_thread(fake_mii.create_rest_app(engine, control), "/healthz"))
            faults = {"internal": ErrorKind.UPSTREAM}
            make = _http(MiiRestBackend, url, deployment=SERVED)
            yield Subject(
                name,
                make,
                tokens,
                engine,
                control,
                streams=False,
                faults=faults,
                health_can_fail=False,
                context_error=ErrorKind.UPSTREAM,  # MII answers a bare 500 "Internal Server Error"
                cancellable=False,
            )
        elif name == "mii_openai":
            url = stack.enter_context(serve_in_thread(fake_mii.create_openai_app(engine, control), "/health"))
            # MII's server streams a role chunk, then drops the connection when generation fails.
            faults = {"internal": ErrorKind.PROTOCOL, "midstream": ErrorKind.PROTOCOL}
            yield Subject(
                name,
                _http(MiiOpenAIBackend, url),
                tokens,
                engine,
                control,
                exact_usage=False,
                faults=faults,
                health_can_fail=False,
                context_error=None,
            )
        else:
            raise ValueError(name)


ALL = [
    "ctranslate2",
    "llama_cpp",
    "vllm",
    "llama_server",
    "trtllm_serve",
    "triton_trtllm",
    "triton_bls",
    "tgi",
    "tgi_messages",
    "mii_rest",
    "mii_openai",
]
