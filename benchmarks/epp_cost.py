"""The endpoint picker's CPU per request: what enginegate costs when a native proxy carries the bytes.

``enginegate epp`` (docs/epp.md) answers Envoy's external-processing stream: the proxy sends each
request's headers and body, the picker runs the same ``choose()`` and answers with the endpoint, the
proxy relays the request and streams the response's headers and body back through the picker (its
timing and reuse feed the estimator). This drives a real picker process the way Envoy does (one
bidirectional gRPC stream per request, the request in full-duplex streamed mode, a whole JSON answer
on the way back), at 1 and 64 concurrent streams, on a realistic pool (eight vLLM endpoints of two
models, health and gauges served by this script on loopback addresses 127.0.0.1-8), and reports the
picker process's CPU per request from the scheduler's accounting. Compare it with the gateway's CPU
per whole answer in ``benchmarks/results/peers.md``: the picker's cost is what enginegate adds per
request in that design; the proxy's own (nginx's in peers.md is about 0.02 ms) comes on top.

    python benchmarks/epp_cost.py [--requests 3000] [--out benchmarks/results/epp_cost.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.peers import cpu_s, tree  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.epp.harness import chat, request_body, request_headers, response_body, response_headers  # noqa: E402

ENDPOINTS = 8
METRICS = (
    b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 0.0\n'
    b'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} 0.0\n'
)
ANSWER = orjson.dumps({
    "id": "x", "object": "chat.completion", "created": 0, "model": "m8b",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok " * 16}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 40, "completion_tokens": 16, "total_tokens": 56},
})  # fmt: skip


def pool_server(port: int) -> None:
    """Every endpoint's /health and /metrics (what the picker polls), on 127.0.0.1 to 127.0.0.8."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                path = line.split()[1] if len(line.split()) > 1 else b"/"
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                body = METRICS if path.startswith(b"/metrics") else b""
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        finally:
            writer.close()

    async def main() -> None:
        hosts = [f"127.0.0.{i + 1}" for i in range(ENDPOINTS)]
        server = await asyncio.start_server(answer, host=hosts, port=port)
        await server.serve_forever()

    asyncio.run(main())


def config(path: Path, port: int) -> Path:
    gpus = ["H100", "H100", "A100-80GB", "A100-80GB", "L4", "L4", "A10G", "A10G"]
    backends = "\n".join(
        f'  - {{name: b{i}, engine: vllm, url: "http://127.0.0.{i + 1}:{port}", model: {"m8b" if i % 4 else "m70b"}, '
        f"gpu: {gpus[i]}, cost_per_hour: {6 - i * 0.5}}}"
        for i in range(ENDPOINTS)
    )
    path.write_text(
        "limits: {health_interval_s: 1.0}\nmodels:\n  - {name: m8b, params_b: 8, dtype: bf16, context: 8192}\n"
        f"  - {{name: m70b, params_b: 8, dtype: bf16, context: 8192}}\nbackends:\n{backends}\n"
    )
    return path


async def one(stub: Any, body: bytes) -> None:
    call = stub.Process()
    await call.write(request_headers(headers=[("x-ttft-budget-ms", "2000")]))
    for message in request_body(body):
        await call.write(message)
    pick = await call.read()
    assert pick.WhichOneof("response") == "request_headers", pick
    await call.read()  # the body handed back
    await call.write(response_headers(content_type="application/json"))
    await call.write(response_body(ANSWER, True))
    await call.done_writing()
    while await call.read() is not grpc.aio.EOF:
        pass


async def drive(port: int, clients: int, requests: int) -> float:
    """Seconds to run ``requests`` through ``clients`` concurrent streams."""
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = ext_grpc.ExternalProcessorStub(channel)
    body = chat("Summarise the report in three lines. " * 4)
    left = [requests]

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            await one(stub, body)

    start = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.monotonic() - start
    await channel.close()
    return elapsed


def ready(port: int, deadline_s: float = 120) -> None:
    """Until the picker's gRPC health says it is ready (its pool polled once)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    until = time.monotonic() + deadline_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < until:
            try:
                check = stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=2)
                if check.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError("the picker never became ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    pool_port, port = free_port(), free_port()
    threading.Thread(target=pool_server, args=(pool_port,), daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="epp-cost-"))
    cfg = config(work / "pool.yaml", pool_port)
    cmd = [sys.executable, "-m", "gateway.cli", "epp", "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)]
    with (work / "epp.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        ready(port)
        for clients in (1, 64):
            asyncio.run(drive(port, clients, args.requests // 5))  # warm-up
            pids = tree(proc.pid)
            before = cpu_s(pids)
            elapsed = asyncio.run(drive(port, clients, args.requests))
            used = cpu_s(pids) - before
            rows.append((clients, args.requests / elapsed, used * 1000 / args.requests))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = [
        "# Endpoint picker: enginegate's CPU per request when a proxy carries the bytes",
        "",
        f"`python benchmarks/epp_cost.py --requests {args.requests}` on {os.cpu_count()} cores: a real",
        "`enginegate epp` process, eight vLLM endpoints of two models, one ext_proc stream per request as Envoy",
        "sends it (headers, body, the pick, the response's headers and whole JSON body back); the driver shares",
        "the machine.",
        "",
        "| concurrent streams | requests/s | picker CPU ms per request |",
        "|---|---|---|",
        *(f"| {c} | {rps:,.0f} | {ms:.3f} |" for c, rps, ms in rows),
        "",
    ]
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
