"""Gateway overhead: the same load straight at a fast fake engine and through a gateway, side by side.

    python benchmarks/overhead.py                      # enginegate in front of the fake engine
    python benchmarks/overhead.py --gateway-url http://127.0.0.1:4000 --model m   # any other gateway
                                                       # (point it at the fake engine, --engine-port)
    python benchmarks/overhead.py --otlp http://127.0.0.1:4318   # enginegate tracing every request there

Load comes from wrk (Debian package ``wrk``) with fixed-duration runs at each concurrency, streaming
and not. Reports requests per second, p50/p99 latency and what the gateway adds, forwarded stream
chunks per second, the gateway's CPU seconds per second and memory (when it runs here), and whether
``x-enginegate-overhead-ms`` agrees with the measured difference. Numbers, not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 16


@dataclass
class Run:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int = 0
    socket_errors: int = 0
    """Connect, read and write errors and timeouts."""


def _ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", value).groups()  # type: ignore[union-attr]
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk(url: str, body: str, concurrency: int, duration: float) -> Run:
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = [[{body}]]\n')
    threads = str(min(2, concurrency))
    cmd = ["wrk", "-t", threads, "-c", str(concurrency), "-d", f"{round(duration)}s", "--latency", "-s", str(script)]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    script.unlink()
    pct = dict(re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.M))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    requests = re.search(r"^\s+(\d+) requests in", out, re.M)
    sockets = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return Run(
        rps=float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        p50_ms=_ms(pct["50"]),
        p99_ms=_ms(pct["99"]),
        errors=int(errors.group(1)) if errors else 0,
        requests=int(requests.group(1)) if requests else 0,
        socket_errors=sum(int(n) for n in sockets.groups()) if sockets else 0,
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) / 1024 if m else 0.0


def wait_for(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def header_median(url: str, body: dict[str, object], n: int = 300) -> float:
    """Median ``x-enginegate-overhead-ms`` over ``n`` sequential requests (NaN for other gateways)."""
    with httpx.Client() as client:
        said = [client.post(url, json=body).headers.get("x-enginegate-overhead-ms") for _ in range(n)]
    values = [float(v) for v in said if v is not None]
    return statistics.median(values) if values else float("nan")


def start_fake_engine(
    port: int, relay_port: int | None = None, pace_ms: float = 0.0, tokens: int = TOKENS
) -> list[subprocess.Popen[bytes]]:
    """The fake engine on ``port`` (and the bare TCP relay to it on ``relay_port``), answering ``tokens``
    tokens; ``pace_ms``: its streams decode-paced, one event per write that many milliseconds apart."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "FAKE_TOKENS": str(tokens), "FAKE_PACE_MS": str(pace_ms)}
    cmd = [str(bin_dir / "uvicorn"), "benchmarks.fake_engine:app", "--port", str(port), "--no-access-log",
           "--log-level", "warning"]  # fmt: skip
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env)]
    if relay_port is not None:
        procs.append(
            subprocess.Popen([sys.executable, str(ROOT / "benchmarks/tcp_relay.py"), str(relay_port), str(port)])
        )
    wait_for(f"http://127.0.0.1:{port}/health")
    return procs


def start_gateway(engine: str, model: str, port: int, otlp: str | None = None) -> subprocess.Popen[bytes]:
    """enginegate in front of ``engine``, ready to serve; ``otlp``: tracing on, spans sent there."""
    config = Path(tempfile.mkdtemp()) / "bench.yaml"
    config.write_text(
        f"models: [{{name: {model}, params_b: 8}}]\n"
        f"backends: [{{name: fake, engine: vllm, url: '{engine}', model: {model}, gpu: H100}}]\n"
        + (f"telemetry: {{otlp_endpoint: '{otlp}'}}\n" if otlp else "")
    )
    bin_dir = Path(sys.executable).parent
    gw = subprocess.Popen(
        [str(bin_dir / "enginegate"), "serve", "--config", str(config), "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
    )
    wait_for(f"http://127.0.0.1:{port}/readyz")
    return gw


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--gateway-url", help="measure this gateway instead of starting enginegate")
    parser.add_argument("--model", default="bench")
    parser.add_argument("--engine-port", type=int, default=8301)
    parser.add_argument("--gateway-port", type=int, default=8302)
    parser.add_argument("--relay-port", type=int, default=8303)
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--otlp", metavar="URL", help="the gateway traces every request to this OTLP/HTTP endpoint")
    parser.add_argument(
        "--soak", type=float, metavar="SECONDS", help="instead: a soak run this long (benchmarks/soak.py)"
    )
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is missing: apt-get install wrk")
    if args.soak:
        sys.path.insert(0, str(ROOT))
        from benchmarks.soak import soak

        soak(args.soak, args.model, args.engine_port, args.gateway_port, args.out)
        return
    procs = start_fake_engine(args.engine_port, args.relay_port)
    engine = f"http://127.0.0.1:{args.engine_port}"
    gateway_pid = None
    try:
        if args.gateway_url:
            gateway = args.gateway_url.rstrip("/")
        else:
            gw = start_gateway(engine, args.model, args.gateway_port, args.otlp)
            procs.append(gw)
            gateway_pid = gw.pid
            gateway = f"http://127.0.0.1:{args.gateway_port}"
        rows = []
        for stream in (False, True):
            body = json.dumps({"model": args.model, "messages": [{"role": "user", "content": "hi"}], "stream": stream})
            for c in (int(x) for x in args.concurrency.split(",")):
                direct = wrk(f"{engine}/v1/chat/completions", body, c, args.duration)
                cpu0 = cpu_seconds(gateway_pid) if gateway_pid else 0.0
                via = wrk(f"{gateway}/v1/chat/completions", body, c, args.duration)
                cpu = (cpu_seconds(gateway_pid) - cpu0) / args.duration if gateway_pid else float("nan")
                rows.append((stream, c, direct, via, cpu))
        # One client, not streaming: what the gateway adds, what a bare byte relay adds (the extra hop
        # and process wake-ups any proxy pays), and what the gateway's header says it added itself.
        one = {"model": args.model, "messages": [{"role": "user", "content": "hi"}]}
        plain = json.dumps({**one, "stream": False})
        direct1 = wrk(f"{engine}/v1/chat/completions", plain, 1, args.duration)
        relay1 = wrk(f"http://127.0.0.1:{args.relay_port}/v1/chat/completions", plain, 1, args.duration)
        via1 = wrk(f"{gateway}/v1/chat/completions", plain, 1, args.duration)
        said = header_median(f"{gateway}/v1/chat/completions", one)
        memory = rss_mb(gateway_pid) if gateway_pid else float("nan")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    lines = [
        f"Gateway: {gateway}{' (tracing to ' + args.otlp + ')' if args.otlp else ''}; engine: fake, {TOKENS} "
        f"tokens per answer; {args.duration:g} s per run; "
        f"wrk on the same machine ({os.cpu_count()} cores).",
        "",
        "| stream | clients | direct req/s | gateway req/s | direct p50 ms | gateway p50 ms | added p50 ms "
        "| direct p99 ms | gateway p99 ms | added p99 ms | chunks/s | gateway CPU s/s | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for stream, c, d, g, cpu in rows:
        chunks = f"{g.rps * TOKENS:,.0f}" if stream else "-"
        lines.append(
            f"| {'yes' if stream else 'no'} | {c} | {d.rps:,.0f} | {g.rps:,.0f} | {d.p50_ms:.2f} | {g.p50_ms:.2f} "
            f"| {g.p50_ms - d.p50_ms:.2f} | {d.p99_ms:.2f} | {g.p99_ms:.2f} | {g.p99_ms - d.p99_ms:.2f} | {chunks} "
            f"| {cpu:.2f} | {d.errors + g.errors} |"
        )
    lines += [
        "",
        f"Gateway memory after the runs: {memory:.0f} MB RSS.",
        f"One client, not streaming (p50): the gateway adds {via1.p50_ms - direct1.p50_ms:.3f} ms; a bare TCP "
        f"relay (benchmarks/tcp_relay.py: the extra hop and process wake-ups) adds {relay1.p50_ms - direct1.p50_ms:.3f}"
        f" ms, leaving {via1.p50_ms - relay1.p50_ms:.3f} ms of the gateway's own work; x-enginegate-overhead-ms says "
        f"{said:.3f} ms (median of 300 sequential requests).",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
