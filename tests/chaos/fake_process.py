"""One contract fake in its own process, so the chaos driver can kill it and start it again on the same port.

``python -m tests.chaos.fake_process --kind tgi --port 8123 --records R.jsonl --seed 7 --fault-rate 0.3``
serves the fake of that engine kind behind the generic fault layer (``control.with_faults``) and the
chaos ``Recorder``.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp

from tests.chaos.recorder import Recorder
from tests.contract import fake_mii, fake_tgi, fake_triton, fake_trtllm_serve
from tests.contract.control import FakeControl, with_faults
from tests.contract.tiny_engine import TinyEngine

KINDS = ("trtllm_serve", "triton_trtllm", "tgi", "tgi_messages", "mii_rest", "mii_openai")

FAULTS: tuple[tuple[str, float], ...] = (
    ("refuse", 1.0),
    ("drop", 1.5),
    ("hang", 0.7),
    ("status_500", 1.0),
    ("status_503", 1.0),
    ("status_429", 1.0),
    ("cut", 1.0),
    ("error_event", 1.0),
    ("malformed", 1.0),
)
"""Per-request faults (``control.GENERIC_FAULTS`` names) and their relative weights."""


def fake_app(kind: str, engine: TinyEngine, control: FakeControl) -> ASGIApp:
    if kind == "trtllm_serve":
        app: ASGIApp = fake_trtllm_serve.create_app(engine, control)
    elif kind == "triton_trtllm":
        app = fake_triton.create_app(engine, control)
    elif kind in ("tgi", "tgi_messages"):
        app = fake_tgi.create_app(engine, control)
    elif kind == "mii_rest":
        app = fake_mii.create_rest_app(engine, control)
    elif kind == "mii_openai":
        app = fake_mii.create_openai_app(engine, control)
    else:
        raise ValueError(kind)
    # A bare Starlette app has no generic fault layer yet; a fake that wraps itself returns something else.
    return with_faults(app, control) if isinstance(app, Starlette) else app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--records", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--seed", required=True)
    parser.add_argument("--fault-rate", type=float, default=0.3)
    parser.add_argument("--decode-s", type=float, default=0.0, help="the engine's time per generated token")
    args = parser.parse_args()
    engine, control = TinyEngine(args.cache), FakeControl()
    engine.token_delay_s = args.decode_s
    rng = random.Random(f"{args.seed}:{args.records.name}")  # one sequence per fake and incarnation
    app = Recorder(fake_app(args.kind, engine, control), control, args.records, rng, args.fault_rate, FAULTS)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
