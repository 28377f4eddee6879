"""Side by side: enginegate and the gateways a user would pick instead, in one interleaved run.

    python benchmarks/peers.py --envs /tmp/peers               # every target, the full run (~35 min)
    python benchmarks/peers.py --clients 1,64 --rounds 2 --duration 5 --out benchmarks/results/peers.md

One instant upstream (``benchmarks/fake_engine.py``: 16 canned tokens, streamed when asked, one JSON body
otherwise) behind each target in turn: nothing (``direct``), nginx ``proxy_pass`` with keep-alive
upstream connections, ``vllm-router`` and ``smg`` (SGLang's model gateway; both Rust), LiteLLM's proxy,
``python-floor`` (``floor_proxy.py``: enginegate's server and engine client with nothing between
them, the least a Python gateway on this stack costs), and enginegate with one worker, with
``--workers``, as ``enginegate-fleet`` with eight backends of two models in its config (the same
upstream behind each; four candidates per request) and, as ``enginegate-granian``, under granian's
Rust HTTP core instead of uvicorn when ``ENVS/granian`` has it, and, as ``enginegate-compiled`` (and
``-compiled-fleet``), with the request path compiled by mypyc as the image builds it (``make compiled``
first). Peers come from PyPI into throwaway
virtual environments under ``--envs`` (``python -m venv ENVS/NAME && ENVS/NAME/bin/pip install
NAME``; LiteLLM as ``litellm[proxy]``): never a project dependency. A target whose program is
missing is left out and said.

Load is wrk's (Debian's ``wrk``). Each round runs every (stream, clients) pair through every target in
turn, after a warm-up, so a drift of the machine hits all alike; the table shows the median of the
rounds. Added latency is against the direct path in the same round. CPU per request comes from the
scheduler's accounting of each target's process tree (``/proc/<pid>/task/*/schedstat``: the process,
its threads and its children) over the run, divided by the requests wrk counted, and the same for the
upstream; RSS is the tree's after the run. Numbers, not pass/fail (``tests/perf`` guards regressions).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.overhead import TOKENS, rss_mb, start_fake_engine, wrk

ROOT = Path(__file__).resolve().parent.parent
MODEL = "bench"


@dataclass
class Target:
    name: str
    url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


@dataclass
class Sample:
    target: str
    stream: bool
    clients: int
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_ms_per_request: float
    upstream_cpu_ms_per_request: float
    rss_mb: float


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in _ls(f"/proc/{p}/task"):
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
            except OSError:
                continue
    return found


def _ls(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def cpu_s(pids: list[int]) -> float:
    """CPU seconds the processes' threads have run, from the scheduler (nanoseconds, not clock ticks)."""
    total = 0
    for pid in pids:
        for task in _ls(f"/proc/{pid}/task"):
            try:
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
            except (OSError, ValueError):
                continue
    return total / 1e9


def _ready(url: str, deadline_s: float = 120) -> None:
    """Until a chat request through ``url`` is answered (a router may still be probing its worker)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        try:
            if httpx.post(f"{url}/v1/chat/completions", json=body, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} never answered")


def _spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def nginx(port: int, engine: str, work: Path) -> list[str] | None:
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        return None
    temp = " ".join(f"{k}_temp_path {work}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (work / "nginx.conf").write_text(
        f"worker_processes 1; daemon off; pid {work}/nginx.pid; error_log {work}/error.log warn;\n"
        "events { worker_connections 4096; }\n"
        f"http {{ access_log off; {temp}\n"
        f"  upstream engine {{ server {engine.removeprefix('http://')}; keepalive 512; }}\n"
        f"  server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://engine; proxy_http_version 1.1;\n"
        '    proxy_set_header Connection ""; proxy_buffering off; } } }\n'
    )
    return [binary, "-p", str(work), "-c", str(work / "nginx.conf")]


def litellm(port: int, engine: str, work: Path, envs: Path) -> list[str]:
    (work / "litellm.yaml").write_text(
        f"model_list:\n  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
        f"      api_base: {engine}/v1\n      api_key: unused\n"
    )
    return [str(envs / "litellm/bin/litellm"), "--config", str(work / "litellm.yaml"), "--host", "127.0.0.1",
            "--port", str(port), "--num_workers", "1"]  # fmt: skip


LITELLM_ENV = {"LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"}
"""A proxy on loopback without keys, as every other target here runs (LiteLLM refuses to start otherwise)."""


def gateway_config(engine: str, path: Path, fleet: bool = False) -> Path:
    """enginegate's config for the target at ``path``: the fake engine as its one vLLM backend, or
    (``fleet``) as eight backends of two models on three kinds of GPU, four serving the benchmark's
    model, so that routing costs what it costs in production (every request has four candidates)."""
    if not fleet:
        path.write_text(
            f"models: [{{name: {MODEL}, params_b: 8}}]\n"
            f"backends: [{{name: fake, engine: vllm, url: '{engine}', model: {MODEL}, gpu: H100}}]\n"
        )
        return path
    gpus = ("H100", "A100-80GB", "L4", "H200")
    lines = [f"models: [{{name: {MODEL}, params_b: 8}}, {{name: other, params_b: 70}}]", "backends:"]
    for i in range(8):
        model, count = (MODEL, 1) if i % 2 == 0 else ("other", 4)
        lines.append(f"  - {{name: b{i}, engine: vllm, url: '{engine}', model: {model}, gpu: {gpus[i // 2]}, "
                     f"gpu_count: {count}, served_model: {MODEL}}}")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def enginegate(port: int, engine: str, work: Path, workers: int, fleet: bool = False) -> list[str]:
    config = gateway_config(engine, work / f"enginegate-{workers}{'-fleet' if fleet else ''}.yaml", fleet)
    return [str(Path(sys.executable).parent / "enginegate"), "serve", "--config", str(config), "--port", str(port),
            "--log-level", "warning", "--workers", str(workers)]  # fmt: skip


def floor(port: int) -> list[str]:
    """The least a Python gateway on enginegate's stack costs (``benchmarks/floor_proxy.py``)."""
    return [str(Path(sys.executable).parent / "uvicorn"), "benchmarks.floor_proxy:app", "--host", "127.0.0.1",
            "--port", str(port), "--no-access-log", "--log-level", "warning"]  # fmt: skip


GRANIAN_CONFIG = "enginegate-granian.yaml"


def granian(port: int, engine: str, work: Path, envs: Path) -> list[str] | None:
    """The same gateway app (one worker) under granian's Rust HTTP core instead of uvicorn: a measurement
    of the protocol layer only. It runs without what enginegate's uvicorn layer adds (its header and
    body limits, one write per response, the graceful drain), so it is not a way to serve."""
    binary = envs / "granian" / "bin" / "granian"
    if not binary.exists():
        return None
    gateway_config(engine, work / GRANIAN_CONFIG)
    return [str(binary), "--interface", "asgi", "--factory", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--log-level", "warning", "gateway.app:from_environment"]  # fmt: skip


COMPILED = ROOT / "build" / "compiled"


def compiled(cmd: list[str]) -> list[str] | None:
    """enginegate as the image runs it: the request path compiled by mypyc (``make compiled`` builds the
    copy this imports from; None until it has)."""
    return cmd if (COMPILED / "COMPILED").exists() else None


def granian_env(work: Path) -> dict[str, str]:
    """The gateway's config, and its code and dependencies from this interpreter (granian's own
    environment has only granian)."""
    import site

    paths = [str(Path(__file__).resolve().parent.parent), *site.getsitepackages()]
    return {"ENGINEGATE_CONFIG": str(work / GRANIAN_CONFIG), "ENGINEGATE_LOG_LEVEL": "warning",
            "PYTHONPATH": os.pathsep.join(paths)}  # fmt: skip


def commands(engine: str, work: Path, envs: Path, workers: int) -> dict[str, Callable[[int], list[str] | None]]:
    """Each target's command for a port (None: not installed here)."""

    def peer(name: str, *args: str) -> Callable[[int], list[str] | None]:
        binary = envs / name / "bin" / name

        def cmd(port: int) -> list[str] | None:
            # Each serves Prometheus metrics on 29000 by default: one port each, or the second cannot start.
            return [str(binary), *args, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", engine,
                    "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
                    "--prometheus-port", str(port + 100)] if binary.exists() else None  # fmt: skip

        return cmd

    return {
        "nginx": lambda port: nginx(port, engine, work),
        "vllm-router": peer("vllm-router"),
        "smg": peer("smg", "launch"),
        "litellm": lambda port: litellm(port, engine, work, envs) if (envs / "litellm/bin/litellm").exists() else None,
        "python-floor": lambda port: floor(port),
        "enginegate": lambda port: enginegate(port, engine, work, 1),
        "enginegate-fleet": lambda port: enginegate(port, engine, work, 1, fleet=True),
        "enginegate-granian": lambda port: granian(port, engine, work, envs),
        "enginegate-compiled": lambda port: compiled(enginegate(port, engine, work, 1)),
        "enginegate-compiled-fleet": lambda port: compiled(enginegate(port, engine, work, 1, fleet=True)),
        f"enginegate-{workers}w": lambda port: enginegate(port, engine, work, workers),
    }


def start(names: list[str], engine: str, work: Path, envs: Path, workers: int) -> list[Target]:
    targets = [Target("direct", engine)]
    made = commands(engine, work, envs, workers)
    for i, name in enumerate(names):
        if name == "direct":
            continue
        port = 18400 + i
        cmd = made[name](port)
        if cmd is None:
            print(f"{name}: not installed, left out (see --envs)", file=sys.stderr)
            continue
        env = (
            LITELLM_ENV if name == "litellm"
            else granian_env(work) if name == "enginegate-granian"
            else {"ENGINE_URL": engine, "PYTHONPATH": str(ROOT)} if name == "python-floor"
            else {"PYTHONPATH": str(COMPILED)} if name.startswith("enginegate-compiled")
            else None
        )  # fmt: skip
        target = Target(name, f"http://127.0.0.1:{port}", [_spawn(cmd, work / f"{name}.log", env)])
        try:
            _ready(target.url)
        except TimeoutError:
            print(f"{name}: never ready, left out ({work / f'{name}.log'})", file=sys.stderr)
            stop([target])
            continue
        targets.append(target)
    return targets


def stop(targets: list[Target]) -> None:
    for t in targets:
        for p in t.procs:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def measure(t: Target, engine_pid: int, stream: bool, clients: int, args: argparse.Namespace, rnd: int) -> Sample:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    url = f"{t.url}/v1/chat/completions"
    if args.warmup:
        wrk(url, body, clients, args.warmup)
    pids = [q for p in t.procs for q in tree(p.pid)]
    cpu0, up0 = cpu_s(pids), cpu_s([engine_pid])
    run = wrk(url, body, clients, args.duration)
    n = max(1, run.requests)
    cpu = (cpu_s(pids) - cpu0) / n * 1000 if pids else 0.0
    rss = sum(rss_mb(p) for p in pids) if pids else 0.0
    return Sample(t.name, stream, clients, rnd, run.rps, run.p50_ms, run.p99_ms, run.errors + run.socket_errors, cpu,
                  (cpu_s([engine_pid]) - up0) / n * 1000, rss)  # fmt: skip


def table(samples: list[Sample]) -> str:
    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")

    groups: dict[tuple[bool, int, str], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.stream, s.clients, s.target), []).append(s)
    out = []
    for stream, clients in sorted({(k[0], k[1]) for k in groups}):
        direct = {s.round: s for s in groups.get((stream, clients, "direct"), [])}
        out += [
            f"\n**{'streams' if stream else 'whole answers'}, {clients} clients**\n",
            "| target | req/s | chunks/s | p50 ms | p99 ms | added p50 ms | added p99 ms | gateway CPU ms/req "
            "| upstream CPU ms/req | RSS MB | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for (st, cl, name), runs in sorted(groups.items(), key=lambda kv: kv[0][2] != "direct"):
            if (st, cl) != (stream, clients):
                continue
            added50 = [s.p50_ms - direct[s.round].p50_ms for s in runs if s.round in direct]
            added99 = [s.p99_ms - direct[s.round].p99_ms for s in runs if s.round in direct]
            rps = med([s.rps for s in runs])
            out.append(f"| {name} | {rps:,.0f} | {rps * TOKENS:,.0f} | " if stream else f"| {name} | {rps:,.0f} | - | ")
            out[-1] += (
                f"{med([s.p50_ms for s in runs]):.2f} | {med([s.p99_ms for s in runs]):.2f} | "
                + ("-" if name == "direct" else f"{med(added50):+.2f}")
                + " | "
                + ("-" if name == "direct" else f"{med(added99):+.2f}")
                + " | "
                + ("-" if name == "direct" else f"{med([s.cpu_ms_per_request for s in runs]):.3f}")
                + f" | {med([s.upstream_cpu_ms_per_request for s in runs]):.3f} | "
                + ("-" if name == "direct" else f"{med([s.rss_mb for s in runs]):.0f}")
                + f" | {sum(s.errors for s in runs)} |"
            )
    return "\n".join(out)


def ratios(samples: list[Sample]) -> str:
    """enginegate's CPU per request over each peer's, per mode, at the most clients run."""
    top = max(s.clients for s in samples)
    lines = []
    for stream in (False, True):
        runs: dict[str, list[float]] = {}
        for s in samples:
            if s.target != "direct" and s.stream == stream and s.clients == top:
                runs.setdefault(s.target, []).append(s.cpu_ms_per_request)
        cpu = {name: statistics.median(values) for name, values in runs.items()}
        ours = cpu.get("enginegate")
        if not ours:
            continue
        peers = ", ".join(f"{n} {ours / v:.1f}x" for n, v in sorted(cpu.items()) if n != "enginegate" and v > 0)
        lines.append(f"- {'streams' if stream else 'whole answers'}, {top} clients: enginegate's CPU per request "
                     f"against {peers}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    every = (
        "direct,nginx,vllm-router,smg,litellm,python-floor,enginegate,enginegate-fleet,enginegate-compiled,"
        "enginegate-compiled-fleet,enginegate-2w"
    )
    parser.add_argument("--targets", default=every, help="which to run (enginegate-Nw: N workers)")
    parser.add_argument("--clients", default="1,16,64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each run")
    parser.add_argument("--modes", default="whole,stream")
    parser.add_argument("--pace-ms", type=float, default=0.0,
                        help="decode-paced streams: the upstream writes one event every PACE ms")  # fmt: skip
    parser.add_argument("--envs", type=Path, default=Path(tempfile.gettempdir()) / "peers",
                        help="the peers' throwaway virtual environments, one per peer")  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the markdown here (and the samples as .json)")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is missing: apt-get install wrk")
    names = args.targets.split(",")
    workers = next((int(n.removeprefix("enginegate-").removesuffix("w")) for n in names if n.endswith("w")), 2)
    work = Path(tempfile.mkdtemp(prefix="peers-"))
    engine_port = 18390
    engine_procs = start_fake_engine(engine_port, pace_ms=args.pace_ms)
    engine = f"http://127.0.0.1:{engine_port}"
    targets: list[Target] = []
    samples: list[Sample] = []
    try:
        targets = start(names, engine, work, args.envs, workers)
        modes = [m == "stream" for m in args.modes.split(",")]
        for rnd in range(args.rounds):
            for stream in modes:
                for clients in (int(c) for c in args.clients.split(",")):
                    for t in targets:
                        samples.append(measure(t, engine_procs[0].pid, stream, clients, args, rnd))
                        print(f"round {rnd + 1}/{args.rounds} {t.name} stream={stream} clients={clients}: "
                              f"{samples[-1].rps:,.0f} req/s", file=sys.stderr)  # fmt: skip
    finally:
        stop(targets)
        for p in engine_procs:
            p.terminate()
    upstream = f"One upstream streaming one event every {args.pace_ms:g} ms" if args.pace_ms else "One instant upstream"
    head = (f"{upstream} (fake engine, {TOKENS} tokens), {args.rounds} interleaved rounds of "
            f"{args.duration:g} s after {args.warmup:g} s of warm-up, medians; wrk on the same machine "
            f"({os.cpu_count()} cores, shared by wrk, the upstream and the target).")  # fmt: skip
    text = head + "\n" + table(samples) + "\n\n" + ratios(samples) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps([asdict(s) for s in samples], indent=1))


if __name__ == "__main__":
    main()
