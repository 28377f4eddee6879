"""Instructions per request of the served gateway, counted by callgrind: the measurement that resolves
a cut of a few percent where wall-clock CPU under wrk moves by 15% from one round to the next.

    python benchmarks/instructions.py                          # this tree, interpreted
    python benchmarks/instructions.py --tree build/compiled    # the compiled copy (make compiled)
    python benchmarks/instructions.py --tree build/compiled --out /tmp/cg   # keep the profiles

``enginegate serve`` runs under ``valgrind --tool=callgrind`` in front of ``benchmarks/fake_engine.py``
(16 tokens, instant) and is sent chat requests over 8 keep-alive connections: 200 to warm up, then
``--requests`` more (or none) before an interrupt stops it. The count per request is the difference
between the two runs' totals, divided by ``--requests``: startup, the warm-up and the shutdown cancel
out, up to their own variation (startup is never quite the same twice: two runs of one build have
differed by up to 20,000 instructions per stream at 400 requests; more requests divide it further, and
a function's own count in the kept profiles varies far less). Whole answers and streams each.
Debian's ``valgrind`` (``apt-get install valgrind``); ``callgrind_annotate`` on the kept profiles shows
where the instructions went, per function.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.overhead import start_fake_engine, wait_for  # noqa: E402

WARMUP, CONNECTIONS = 200, 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _send(port: int, stream: bool, count: int) -> None:
    """``count`` chat requests over ``CONNECTIONS`` keep-alive connections, each answered 200."""
    body = json.dumps(
        {"model": "bench", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 16, "stream": stream}
    )

    def one_connection(n: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        for _ in range(n):
            connection.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            response = connection.getresponse()
            data = response.read()
            if response.status != 200:
                raise RuntimeError(f"{response.status}: {data[:200]!r}")
        connection.close()

    threads = [threading.Thread(target=one_connection, args=(count // CONNECTIONS,)) for _ in range(CONNECTIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _total(tree: Path, engine: str, stream: bool, requests: int, out: Path) -> int:
    """The instructions of one served run: warm-up, then ``requests``, then the interrupt."""
    config = out.parent / "instructions.yaml"
    config.write_text(
        "models: [{name: bench, params_b: 8}]\n"
        f"backends: [{{name: fake, engine: vllm, url: '{engine}', model: bench, gpu: H100}}]\n"
    )
    port = _free_port()
    gateway = str(Path(sys.executable).parent / "enginegate")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", gateway, "serve", "--config", str(config),
           "--port", str(port), "--log-level", "warning"]  # fmt: skip
    server = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(tree)}, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", timeout_s=600)  # a minute or so under callgrind
        _send(port, stream, WARMUP)
        if requests:
            _send(port, stream, requests)
    finally:
        server.send_signal(2)
        server.wait(timeout=600)
    found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no totals in {out}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the tree to serve from (default this one)")
    parser.add_argument("--requests", type=int, default=400, help="requests counted after the warm-up")
    parser.add_argument("--out", type=Path, help="a folder to keep the callgrind profiles in")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    engines = start_fake_engine(port)
    results = {}
    try:
        for stream in (False, True):
            name = "stream" if stream else "whole"
            none = _total(args.tree.resolve(), f"http://127.0.0.1:{port}", stream, 0, out / f"{name}.0")
            some = _total(args.tree.resolve(), f"http://127.0.0.1:{port}", stream, args.requests, out / f"{name}.n")
            results[name] = round((some - none) / args.requests)
    finally:
        for engine in engines:
            engine.terminate()
    print(json.dumps({"instructions_per_request": results, "requests": args.requests, "profiles": str(out)}))


if __name__ == "__main__":
    main()
