"""Decode-paced streams side by side: each target's CPU per streamed event and per stream, measured.

    python benchmarks/paced.py --out benchmarks/results/paced.md     # (~5 min)

The instant upstream of ``peers.py`` sends a stream's events in one write, so a proxy reads them
together and its cost per event is what it pays for an event among many. A real engine writes each
token as it is decoded, tens of milliseconds apart: every event then costs a proxy a wake-up, a read
and a write of its own. Here the fake engine writes one event every ``--pace-ms`` (``FAKE_PACE_MS``),
and each target is measured (wrk, interleaved rounds, CPU from the scheduler's accounting of its
process tree, as ``peers.py``) with streams of two lengths; the difference in CPU per stream over
the difference in events is the cost of one event, the rest is the cost of a stream. From those, the
cores a fleet needs in front of it: ``--fleet-streams`` concurrent streams of ``--fleet-tokens``
tokens at ``--fleet-rate`` tokens a second. Targets as in ``peers.py`` (``--envs`` for the peers).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import peers
from benchmarks.overhead import start_fake_engine


def run(tokens: int, names: list[str], args: argparse.Namespace, work: Path) -> list[peers.Sample]:
    """Every round of streams of ``tokens`` tokens through every target."""
    port = 18390
    engine_procs = start_fake_engine(port, pace_ms=args.pace_ms, tokens=tokens)
    engine = f"http://127.0.0.1:{port}"
    targets: list[peers.Target] = []
    samples: list[peers.Sample] = []
    try:
        targets = peers.start(names, engine, work, args.envs, 2)
        for rnd in range(args.rounds):
            for t in targets if rnd % 2 == 0 else targets[::-1]:
                samples.append(peers.measure(t, engine_procs[0].pid, True, args.clients, args, rnd))
                print(f"{tokens} tokens, round {rnd + 1}/{args.rounds} {t.name}: {samples[-1].rps:,.0f} streams/s",
                      file=sys.stderr)  # fmt: skip
    finally:
        peers.stop(targets)
        for p in engine_procs:
            p.terminate()
            p.wait()
    return samples


def fit(short: list[peers.Sample], long: list[peers.Sample], n_short: int, n_long: int) -> dict[str, dict[str, float]]:
    """Per target: CPU per event and per stream (ms) from the median CPU per stream at two lengths.
    A stream of n tokens is n + 1 writes of the upstream (the last carries the finish and usage)."""
    out = {}
    for name in dict.fromkeys(s.target for s in short):
        if name == "direct":
            continue
        a = statistics.median(s.cpu_ms_per_request for s in short if s.target == name)
        b = statistics.median([s.cpu_ms_per_request for s in long if s.target == name] or [float("nan")])
        up = statistics.median(s.upstream_cpu_ms_per_request for s in long if s.target == name)
        event = (b - a) / (n_long - n_short)
        out[name] = {"short_ms": a, "long_ms": b, "event_ms": event, "stream_ms": a - (n_short + 1) * event,
                     "upstream_long_ms": up}  # fmt: skip
    return out


def table(fits: dict[str, dict[str, float]], args: argparse.Namespace, n_short: int, n_long: int) -> str:
    streams_s = args.fleet_streams * args.fleet_rate / args.fleet_tokens  # streams started per second
    events_s = args.fleet_streams * args.fleet_rate + streams_s
    lines = [
        f"| target | CPU per stream, {n_short} tokens | {n_long} tokens | per event | per stream | "
        f"events/s per core | cores for {args.fleet_streams:,} streams |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, f in fits.items():
        cores = (streams_s * f["stream_ms"] + events_s * f["event_ms"]) / 1000
        lines.append(
            f"| {name} | {f['short_ms']:.3f} ms | {f['long_ms']:.3f} ms | {f['event_ms'] * 1000:.1f} µs | "
            f"{f['stream_ms'] * 1000:.0f} µs | {1000 / f['event_ms']:,.0f} | {cores:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--targets", default="direct,vllm-router,smg,python-floor,enginegate-compiled")
    parser.add_argument("--tokens", default="8,32", help="the two stream lengths")
    parser.add_argument("--pace-ms", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds per run, long beside a stream: those cut at its end go uncounted")  # fmt: skip
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--fleet-streams", type=int, default=100_000)
    parser.add_argument("--fleet-rate", type=float, default=30.0, help="tokens a second per stream")
    parser.add_argument("--fleet-tokens", type=int, default=500, help="tokens per answer")
    parser.add_argument("--envs", type=Path, default=Path(tempfile.gettempdir()) / "peers")
    parser.add_argument("--out", type=Path, help="also write the markdown here (and the samples as .json)")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is missing: apt-get install wrk")
    n_short, n_long = (int(n) for n in args.tokens.split(","))
    work = Path(tempfile.mkdtemp(prefix="paced-"))
    names = args.targets.split(",")
    short, long = run(n_short, names, args, work), run(n_long, names, args, work)
    fits = fit(short, long, n_short, n_long)
    text = (
        f"Decode-paced upstream (one event every {args.pace_ms:g} ms), {args.clients} concurrent streams of "
        f"{n_short} and of {n_long} tokens, {args.rounds} interleaved rounds of {args.duration:g} s, medians; "
        f"wrk on the same machine ({os.cpu_count()} cores, shared by wrk, the upstream and the target). Per "
        f"event and per stream fitted from the two lengths; cores for {args.fleet_streams:,} concurrent "
        f"streams of {args.fleet_tokens} tokens at {args.fleet_rate:g} tokens/s.\n\n"
        + table(fits, args, n_short, n_long)
        + "\n"
    )
    print(text)
    if args.out:
        args.out.write_text(text)
        samples = {"short": [asdict(s) for s in short], "long": [asdict(s) for s in long], "fits": fits}
        args.out.with_suffix(".json").write_text(json.dumps(samples, indent=1))


if __name__ == "__main__":
    main()
