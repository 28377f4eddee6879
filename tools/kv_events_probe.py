"""Probe a running vLLM's KV-cache event stream (ZMQ PUB) and print what arrives, decoded.

Starts nothing: point it at a vLLM started with ``--enable-prefix-caching --kv-events-config
'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:PORT", "topic": "T"}'``.

    .venv-vllm/bin/python tools/kv_events_probe.py --endpoint tcp://127.0.0.1:PORT \\
        --base-url http://127.0.0.1:HTTP_PORT --topic T [--replay tcp://127.0.0.1:RPORT]

Needs pyzmq and msgspec: /work/main/.venv-vllm has both (vLLM depends on them); /work/main/.venv has
neither. HTTP goes through the standard library so nothing else is needed.

What it does: connects a SUB socket and waits for the ZMTP handshake (a PUB drops whatever it
publishes before a subscriber is attached: there is no late join without the replay socket), sends
two completions whose prompts share a long prefix and differ only at the end, collects frames until
a deadline, and prints each one as ``topic``, sequence number and the msgpack payload decoded
without a schema (so the output shows the wire shape, not vLLM's classes). With ``--verify-hashes``
it recomputes each stored block's hash from the token ids in the event (sha256 over a pickle of
(parent digest, token tuple, extra keys), chained from a seed digest) and says whether it matches.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
import time
import urllib.request
from typing import Any

import msgspec
import zmq
from zmq.utils.monitor import recv_monitor_message

# vLLM's default seed for the first block's parent when PYTHONHASHSEED is unset and the hash is sha256.
DEFAULT_SEED = "vllm-none-hash"
END_SEQ = -1


def wait_connected(sock: zmq.Socket[bytes], timeout: float) -> bool:
    """Block until the socket's ZMTP handshake with the publisher succeeded (slow-joiner guard)."""
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if (
                monitor.poll(int(left * 1000))
                and recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
            ):
                return True
        return False
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)


def long_prompt(n_items: int, tail: str) -> str:
    # Several hundred tokens of shared text: vLLM only hashes and reports full blocks (128 tokens
    # on the CPU build), so the shared prefix must span several of them.
    body = " ".join(f"Item {i} is stored on shelf {i % 7} next to item {i + 1}." for i in range(n_items))
    return f"{body}\n{tail}"


def complete(base_url: str, model: str, prompt: str, xargs: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    if xargs:
        body["vllm_xargs"] = xargs
    req = urllib.request.Request(
        f"{base_url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        answer: dict[str, Any] = json.load(resp)
    return answer


def block_digest(parent: bytes, tokens: list[int], extra: tuple[Any, ...] | None) -> bytes:
    return hashlib.sha256(pickle.dumps((parent, tuple(tokens), extra), protocol=pickle.HIGHEST_PROTOCOL)).digest()


class HashChecker:
    """Recomputes BlockStored hashes from the events' own token ids, remembering full digests by the
    published value: the event carries only a truncated form, but the chain runs on full digests."""

    def __init__(self, seed: str) -> None:
        self.root = hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()
        self.full: dict[Any, bytes] = {}

    @staticmethod
    def external(digest: bytes, published: Any) -> Any:
        # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (default): the low 64 bits of the big-endian digest.
        return int.from_bytes(digest, "big") & ((1 << 64) - 1) if isinstance(published, int) else digest

    def check(self, event: dict[str, Any]) -> str:
        parent_pub = event.get("parent_block_hash")
        parent = self.root if parent_pub is None else self.full.get(parent_pub)
        if parent is None:
            return "parent not seen: cannot verify"
        tokens: list[int] = event["token_ids"]
        size: int = event["block_size"]
        extras = event.get("extra_keys") or [None] * len(event["block_hashes"])
        ok = 0
        for i, published in enumerate(event["block_hashes"]):
            extra = tuple(extras[i]) if extras[i] is not None else None
            parent = block_digest(parent, tokens[i * size : (i + 1) * size], extra)
            self.full[published] = parent
            ok += self.external(parent, published) == published
        return f"{ok}/{len(event['block_hashes'])} block hashes recomputed from token_ids match"


def show(frames: list[bytes], checker: HashChecker | None) -> None:
    if len(frames) != 3:
        print(f"unexpected {len(frames)}-frame message: {[f[:40] for f in frames]}")
        return
    topic, seq_bytes, payload = frames
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    batch = msgspec.msgpack.decode(payload)
    print(f"topic={topic!r} seq={seq} payload={len(payload)} bytes, top level {type(batch).__name__}[{len(batch)}]")
    ts, events, *rest = batch
    print(f"  ts={ts} data_parallel_rank={rest[0] if rest else '(omitted)'} events={len(events)}")
    for event in events:
        brief = {k: v for k, v in event.items() if k != "token_ids"}
        if "block_hashes" in brief and len(brief["block_hashes"]) > 4:
            hashes = brief["block_hashes"]
            brief["block_hashes"] = [*hashes[:3], f"... {len(hashes)} in all"]
        if "token_ids" in event:
            brief["token_ids"] = f"{len(event['token_ids'])} ints, first {event['token_ids'][:8]}"
        print(f"  keys in wire order: {list(event)}")
        print(f"  {json.dumps(brief, default=repr)}")
        if checker is not None and event.get("type") == "BlockStored":
            print(f"  verify: {checker.check(event)}")


def replay(endpoint: str, start: int, timeout: float, checker: HashChecker | None) -> None:
    """Ask the ROUTER for every buffered batch from ``start`` on; a DEALER sees [b"", topic, seq, payload]."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not dealer.poll(int(left * 1000)):
                break
            frames = dealer.recv_multipart()
            if int.from_bytes(frames[2], "big", signed=True) == END_SEQ:
                print(f"replay: end marker {frames}")
                return
            print(f"replay: {len(frames)} frames, empty delimiter first: {frames[0] == b''}")
            show(frames[1:], checker)
        print("replay: no end marker before the deadline")
    finally:
        dealer.close(linger=0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", required=True, help="PUB endpoint to connect to, e.g. tcp://127.0.0.1:5557")
    p.add_argument("--base-url", required=True, help="vLLM base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default="enginegate-demo")
    p.add_argument("--topic", default="", help="subscription prefix; empty takes every topic")
    p.add_argument("--seconds", type=float, default=30.0, help="how long to collect after the requests")
    p.add_argument("--items", type=int, default=60, help="sentences in the shared prefix (~14 tokens each)")
    p.add_argument("--tag", default="", help="text put at the start of the prompts, to make them new to the cache")
    p.add_argument("--report-mode", choices=["incremental", "full"], help="sent as vllm_xargs.kv_cache_report_mode")
    p.add_argument("--replay", help="ROUTER endpoint: after collecting, ask it to resend from sequence 0")
    p.add_argument("--verify-hashes", action="store_true", help="recompute sha256 block hashes from token_ids")
    p.add_argument("--seed", default=DEFAULT_SEED, help="NONE_HASH seed (PYTHONHASHSEED if the engine had one)")
    args = p.parse_args(argv)

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
    sub.connect(args.endpoint)
    if not wait_connected(sub, 10.0):
        print(f"no ZMTP handshake with {args.endpoint} in 10 s", file=sys.stderr)
        return 1
    time.sleep(0.2)  # the SUBSCRIBE message goes out right after the handshake; let the PUB apply it
    checker = HashChecker(args.seed) if args.verify_hashes else None
    xargs = {"kv_cache_report_mode": args.report_mode} if args.report_mode else None

    received = 0
    for name in ("first", "second"):
        prompt = args.tag + long_prompt(args.items, f"Question ({name}): which shelf holds item 5?")
        usage = complete(args.base_url, args.model, prompt, xargs).get("usage", {})
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        print(f"== {name} request: prompt_tokens={usage.get('prompt_tokens')} cached_tokens={cached}")
        # Drain what this request produced before sending the next, so the output reads in order.
        deadline = time.monotonic() + (3.0 if name == "first" else args.seconds)
        while (left := deadline - time.monotonic()) > 0:
            if sub.poll(int(min(left, 0.5) * 1000)):
                show(sub.recv_multipart(), checker)
                received += 1
    print(f"== {received} message(s) received on {args.endpoint} (topic filter {args.topic!r})")
    sub.close(linger=0)
    if args.replay:
        replay(args.replay, 0, 5.0, checker)
    return 0 if received else 2


if __name__ == "__main__":
    raise SystemExit(main())
