"""The chaos run's figures and the checks on them, with evidence (request ids, gateway log lines) for each miss.

Sources: what the clients saw (``Result``), what the fakes saw (``Upstream``), what the gateway logged
(its JSON request lines: ``attempts`` per request id), the recovery probes, and the fakes' open
streams after the run.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tests.chaos.clients import Result
from tests.chaos.fleet import Upstream

LEFT_DEADLINE_S = 3.0
"""An upstream stream must have ended this long after its client left."""
RECOVERY_BOUND_S = 20.0
"""After a killed engine is back, requests must reach it again within this (the breaker's default
cooldown is 10 s; a healthy engine back sooner must not wait longer than that)."""
MIN_COMPLETED_SHARE = 0.6
"""Of the requests that stayed to the end: a gateway that fails everything cleanly is still broken."""


@dataclass
class Recovery:
    backend: str
    down_s: float
    """How long the engine was gone (killed) or failing (burst)."""
    back_at: float
    kind: str = "kill"
    recovered_at: float | None = None
    probes: int = 0
    fleet_seen: list[str] = field(default_factory=list)
    """The backend's (healthy, breaker) in /admin/fleet each time it changed while waiting."""

    @property
    def took_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.back_at


@dataclass
class Figures:
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    """(figure, value, required)"""
    misses: list[str] = field(default_factory=list)
    """One paragraph per failed check, with evidence."""
    info: list[str] = field(default_factory=list)

    def row(self, figure: str, value: object, required: str = "") -> None:
        self.rows.append((figure, str(value), required))

    def table(self) -> str:
        width = max(len(r[0]) for r in self.rows)
        lines = [f"| {'figure'.ljust(width)} | value | required |", f"|{'-' * (width + 2)}|-------|----------|"]
        lines += [f"| {f.ljust(width)} | {v} | {m} |" for f, v, m in self.rows]
        return "\n".join(lines)


def gateway_log(
    path: Path,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """(the request line per request id, every line per request id, error-level lines) from the gateway's
    JSON log. The ids are the clients' own (``client_request_id``, which the request line pairs with the
    gateway's id); a line of a request without one keeps the gateway's."""
    docs: list[dict[str, Any]] = []
    for raw in path.read_text().splitlines():
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    theirs = {
        d["request_id"]: d["client_request_id"]
        for d in docs
        if d.get("msg") == "request" and isinstance(d.get("client_request_id"), str)
    }
    requests: dict[str, dict[str, Any]] = {}
    lines: dict[str, list[dict[str, Any]]] = defaultdict(list)
    errors = [d for d in docs if d.get("level") in ("error", "critical")]
    for doc in docs:
        rid = doc.get("request_id")
        if not isinstance(rid, str):
            continue
        rid = theirs.get(rid, rid)
        lines[rid].append(doc)
        if doc.get("msg") == "request":
            requests[rid] = doc
    return requests, lines, errors


def _brief(doc: dict[str, Any]) -> str:
    keep = ("ts", "level", "msg", "backend", "kind", "outcome", "error_kind", "attempts", "stream", "exc")
    return json.dumps({k: (str(doc[k])[-300:] if k == "exc" else doc[k]) for k in keep if k in doc})


def _evidence(
    rids: list[str], results: dict[str, Result], lines: dict[str, list[dict[str, Any]]], ups: dict[str, list[Upstream]]
) -> str:
    out = []
    for rid in rids[:5]:
        r = results.get(rid)
        seen = f"client: {r.outcome} status={r.status} backend={r.backend or '-'} {r.detail}" if r else "client: -"
        out.append(f"  {rid}  {seen}")
        out += [f"    gateway: {_brief(doc)}" for doc in lines.get(rid, [])]
        out += [
            f"    upstream: {u.backend}#{u.incarnation} fault={u.fault} open_s="
            f"{'still open' if u.end is None else round(u.end - u.start, 3)}"
            for u in ups.get(rid, [])
        ]
    if len(rids) > 5:
        out.append(f"  ... and {len(rids) - 5} more: {' '.join(rids[5:40])}")
    return "\n".join(out)


def analyse(
    results: list[Result],
    upstream: list[Upstream],
    log_path: Path,
    recoveries: list[Recovery],
    open_at_end: dict[str, int],
    reloads: list[str],
    gateway_alive: bool = True,
) -> Figures:
    fig = Figures()
    requests, lines, errors = gateway_log(log_path)
    # Engines see the gateway's own request id: named by the client's, through the request lines.
    theirs = {doc["request_id"]: rid for rid, doc in requests.items() if isinstance(doc.get("request_id"), str)}
    upstream = [replace(u, header=theirs.get(u.header, u.header)) for u in upstream]
    by_rid = {r.spec.rid: r for r in results}
    ups: dict[str, list[Upstream]] = defaultdict(list)
    for u in upstream:
        ups[u.key].append(u)
    clients = [r for r in results if not r.spec.probe]
    probes = [r for r in results if r.spec.probe]
    outcomes = Counter(r.outcome for r in clients)
    stayed = [r for r in clients if r.outcome != "left"]
    failed_over = [
        r for r in clients if r.outcome == "completed" and requests.get(r.spec.rid, {}).get("attempts", 0) > 1
    ]

    def check(figure: str, bad: list[str], why: str) -> None:
        fig.row(figure, len(bad), "0")
        if bad:
            fig.misses.append(f"{figure}: {len(bad)} ({why})\n{_evidence(bad, by_rid, lines, ups)}")

    fig.row("client requests sent", len(clients))
    fig.row("completed", outcomes["completed"])
    fig.row("failed over (completed after a failed attempt)", len(failed_over))
    fig.row("ended with a clean OpenAI error", outcomes["error"])
    fig.row("left early (by design)", outcomes["left"])
    probe_outcomes = Counter(r.outcome for r in probes)
    fig.row("recovery probes sent (completed)", f"{len(probes)} ({probe_outcomes['completed']})")
    check("hung (client deadline passed)", [r.spec.rid for r in results if r.outcome == "hung"], "no end in time")
    check(
        "truncated without an error event",
        [r.spec.rid for r in results if r.outcome == "truncated"],
        "stream ended without finish_reason+[DONE] or error event+[DONE]",
    )
    check(
        "unclean errors",
        [r.spec.rid for r in results if r.outcome == "unclean"],
        "an error that is not OpenAI error JSON, or a broken connection",
    )
    share = sum(r.outcome == "completed" for r in stayed) / max(1, len(stayed))
    fig.row("completed share of client requests that stayed", f"{share:.0%}", f">= {MIN_COMPLETED_SHARE:.0%}")
    if share < MIN_COMPLETED_SHARE:
        fig.misses.append(f"completed share {share:.0%} < {MIN_COMPLETED_SHARE:.0%}: {dict(outcomes)}")

    # At most one upstream generation per attempt the gateway counted (and logged).
    over = []
    for rid in by_rid:
        generated = sum(u.generated for u in ups.get(rid, []))
        attempts = requests.get(rid, {}).get("attempts")
        if generated and (not isinstance(attempts, int) or generated > attempts):
            over.append(rid)
    check("requests with more upstream generations than attempts", over, "generations > logged attempts")
    posts = Counter(len(ups.get(r.spec.rid, [])) for r in clients)
    fig.info.append(f"upstream POSTs per client request: {dict(sorted(posts.items()))}")
    unattributed = [u for u in upstream if not u.key]
    strangers = sorted({u.key for u in upstream if u.key and u.key not in by_rid})
    mismatched = sorted({u.marker for u in upstream if u.header and u.marker and u.header != u.marker})
    with_header = sum(bool(u.header) for u in upstream)
    fig.row("upstream POSTs carrying X-Request-Id", f"{with_header}/{len(upstream)}", "all")
    if with_header < len(upstream):
        fig.misses.append(
            f"upstream POSTs without X-Request-Id: {len(upstream) - with_header} of {len(upstream)} "
            f"({len(unattributed)} cannot be attributed at all: recovery probes, whose prompts carry no id)"
        )
    if strangers or mismatched:
        fig.misses.append(f"upstream request ids the clients never sent: {strangers[:10]}; header != body id: "
                          f"{mismatched[:10]}")  # fmt: skip

    # Upstream streams still open after their client left.
    lingering = []
    for r in results:
        if r.left_at is None:
            continue
        if any(u.end is None or u.end > r.left_at + LEFT_DEADLINE_S for u in ups.get(r.spec.rid, [])):
            lingering.append(r.spec.rid)
    check(f"upstream open > {LEFT_DEADLINE_S:g}s after its client left", lingering, "engine kept working")
    still = sum(open_at_end.values())
    fig.row("upstream streams open after the run", still, "0")
    if still:
        fig.misses.append(f"upstream streams open after the run: {open_at_end}")

    ok = [x for x in recoveries if x.took_s is not None and x.took_s <= RECOVERY_BOUND_S]
    took = ", ".join(
        f"{x.backend} ({x.kind}) {'never' if x.took_s is None else f'{x.took_s:.1f}s'}" for x in recoveries
    )  # fmt: skip
    fig.row(f"breaker recoveries within {RECOVERY_BOUND_S:g}s of the engine's return", f"{len(ok)}/{len(recoveries)}",
            "all")  # fmt: skip
    fig.info.append(f"recoveries: {took}")
    for x in recoveries:
        if x not in ok:
            fig.misses.append(
                f"{x.backend} back after a {x.kind} of {x.down_s:g}s, no probe answered by it within "
                f"{RECOVERY_BOUND_S:g}s ({'never' if x.took_s is None else f'{x.took_s:.1f}s'}, {x.probes} probes); "
                f"/admin/fleet (healthy, breaker) seen: {' -> '.join(x.fleet_seen)}"
            )
    if not recoveries:
        fig.misses.append("no engine was killed and restarted: the recovery check proved nothing")

    failed_reloads = [r for r in reloads if not r.endswith(("=ok", "=200"))]
    fig.row("reloads applied", f"{len(reloads) - len(failed_reloads)}/{len(reloads)}", "all")
    if failed_reloads:
        fig.misses.append(f"reloads not applied: {failed_reloads}")
    if not gateway_alive:
        fig.misses.append("the gateway process died during the run (see its log)")
    if errors:
        fig.info.append(f"gateway error-level log lines: {len(errors)}; first: {_brief(errors[0])}")

    faults = Counter(u.fault or "none" for u in upstream)
    fig.info.append(f"per-request faults drawn by the fakes: {dict(sorted(faults.items()))}")
    fig.info.append(f"answered by: {dict(sorted(Counter(r.backend or '-' for r in results).items()))}")
    fig.info.append(f"client outcomes: {dict(sorted(outcomes.items()))}")
    kinds = Counter(
        f"{'stream' if r.spec.stream else 'whole'} {r.detail[:40]}" for r in clients if r.outcome == "error"
    )
    fig.info.append(f"clean errors (stream or whole answer, status/code): {dict(sorted(kinds.items()))}")
    fig.info.append(f"reloads: {', '.join(reloads)}")
    missing_log = [rid for rid in by_rid if rid not in requests]
    if missing_log:
        gone = [f"{rid} ({by_rid[rid].outcome})" for rid in missing_log[:10]]
        fig.info.append(f"{len(missing_log)} requests without a gateway request log line: {', '.join(gone)}")
    return fig
