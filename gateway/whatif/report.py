"""One what-if answer (the structural diff, the moves, the simulator's table) as JSON and as text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.config import LoadedConfig
from gateway.whatif.diff import diff, summary
from gateway.whatif.records import Replayed
from gateway.whatif.replay import DEFAULT_SCALES, NoRate, moves, table
from routing.sim.report import FAILURE_COLUMNS


def what_if(
    old: LoadedConfig,
    new: LoadedConfig,
    requests: Sequence[Replayed] = (),
    rates: Sequence[float] | None = None,
    scales: Sequence[float] = DEFAULT_SCALES,
    deadline_s: float | None = None,
) -> dict[str, Any]:
    """``{"diff": [...], "summary": {...}, "moves": {...}, "table": [...]}``; without requests, the
    diff alone (``moves`` and ``table`` empty)."""
    changes = diff(old.config, new.config)
    doc: dict[str, Any] = {
        "diff": [c.to_dict() for c in changes],
        "summary": summary(changes),
        "moves": {},
        "table": [],
    }
    if requests:
        doc["moves"] = moves(requests, old, new)
        try:
            doc["table"] = table(requests, {"old": old, "new": new}, rates, scales, deadline_s)
        except NoRate as exc:  # the moves stand; the simulator needs a rate to scale
            doc["note"] = str(exc)
    return doc


def _line(change: dict[str, Any]) -> str:
    kind, path, old, new = change["kind"], change["path"], change["old"], change["new"]
    if kind == "added":
        return f"+ {path}" + ("" if isinstance(new, dict) else f": {new!r}")
    if kind == "removed":
        return f"- {path}" + ("" if isinstance(old, dict) else f" (was {old!r})")
    return f"~ {path}: {old!r} -> {new!r}"


TABLE_COLUMNS = (
    "config", "rate req/s", "x logged", "within budget %", "TTFT p50 ms", "TTFT p99 ms", "GPU $/h",
    "busy GPU $/h", *FAILURE_COLUMNS.values(),
)  # fmt: skip


def _cells(row: dict[str, Any]) -> list[str]:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    return [
        row["config"], f"{row['rate_rps']:.2f}", f"{row['scale']:g}", f"{row['within_budget_pct']:.1f}",
        ms(row["ttft_p50_ms"]), ms(row["ttft_p99_ms"]), f"{row['gpu_usd_per_hour']:.2f}",
        f"{row['busy_gpu_usd_per_hour']:.2f}", *(str(row["failures"][k]) for k in FAILURE_COLUMNS),
    ]  # fmt: skip


def text(doc: dict[str, Any]) -> str:
    """The answer as a person reads it in a terminal."""
    out = ["Changes:" if doc["diff"] else "No changes."]
    out += [f"  {_line(c)}" for c in doc["diff"]]
    m = doc["moves"]
    if m:
        out += ["", f"Routing decisions that move: {m['moved']} of {m['requests']} ({m['moved_share']:.1%})"]
        out += [f"  {p['from']} -> {p['to']}: {p['count']}" for p in m["from_to"] if p["from"] != p["to"]]
        stay = sum(p["count"] for p in m["from_to"] if p["from"] == p["to"])
        out.append(f"  unchanged: {stay}")
    if doc.get("note"):
        out += ["", f"Not simulated: {doc['note']}"]
    if doc["table"]:
        rows = [list(TABLE_COLUMNS), *(_cells(r) for r in doc["table"])]
        widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_COLUMNS))]
        out += ["", "Simulated (enginegate's policy on each config's fleet, the same requests):"]
        out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(out)
