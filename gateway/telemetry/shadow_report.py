"""``enginegate shadow report FILE``, and ``GET /admin/shadow``: shadow traffic's comparisons summed up
per (rule, primary backend, candidate backend).

For each group: the pairs, the candidate's failures, how often the answers agreed (exact for greedy
requests, word-set Jaccard otherwise: ``gateway.telemetry.shadow_pairs``), the share of budgets each
side met (over the pairs whose request had a budget: its time to first token, whole-answer and
per-token budgets, each side's times counted from when both were sent), the p50 and p99 of TTFT,
TPOT and end-to-end side by side, tokens and finish reasons of each side, and the cost of each side
(each request's share of its backend's ``cost_per_hour``: ``Side.cost_usd``), in total and per
million completion tokens.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

SIDES = ("primary", "shadow")
"""A record's two sides; the summary calls the shadow's side ``candidate``."""
NAMES = {"primary": "primary", "shadow": "candidate"}


def read(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a JSON-lines file; a line that is not a record (a torn last write) is skipped."""
    with path.open("rb") as f:
        for line in f:
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("primary"), dict) and isinstance(doc.get("shadow"), dict):
                yield doc


def met(side: dict[str, Any], budget: dict[str, Any]) -> bool | None:
    """Whether one side met the request's budgets; None when the request had none."""
    limits = [(side.get(k), budget.get(b)) for k, b in (("ttft_ms", "ttft_ms"), ("e2e_ms", "latency_ms"),
                                                          ("tpot_ms", "tpot_ms"))]  # fmt: skip
    if all(limit is None for _, limit in limits):
        return None
    if side.get("outcome") != "ok":
        return False
    return all(limit is None or (value is not None and value <= limit) for value, limit in limits)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class _Group:
    def __init__(self) -> None:
        self.pairs = 0
        self.failed = 0
        self.compared = 0
        self.agreed = 0
        self.scores: list[float] = []
        self.budgeted = 0
        self.met = dict.fromkeys(SIDES, 0)
        self.times: dict[str, dict[str, list[float]]] = {s: {"ttft_ms": [], "tpot_ms": [], "e2e_ms": []} for s in SIDES}
        self.tokens = dict.fromkeys(SIDES, 0)
        self.finish: dict[str, dict[str, int]] = {s: {} for s in SIDES}
        self.cost = dict.fromkeys(SIDES, 0.0)

    def add(self, doc: dict[str, Any]) -> None:
        self.pairs += 1
        self.failed += doc["shadow"].get("outcome") != "ok"
        agreement = doc.get("agreement")
        if isinstance(agreement, dict):
            self.compared += 1
            self.agreed += bool(agreement.get("agree"))
            self.scores.append(float(agreement.get("score") or 0.0))
        budget = doc.get("budget") or {}
        verdicts = {s: met(doc[s], budget) for s in SIDES}
        if verdicts["primary"] is not None:
            self.budgeted += 1
            for s in SIDES:
                self.met[s] += bool(verdicts[s])
        for s in SIDES:
            side = doc[s]
            for key, values in self.times[s].items():
                if isinstance(side.get(key), int | float):
                    values.append(float(side[key]))
            self.tokens[s] += side.get("completion_tokens") or 0
            reason = side.get("finish_reason") or side.get("error") or "none"
            self.finish[s][reason] = self.finish[s].get(reason, 0) + 1
            self.cost[s] += side.get("cost_usd") or 0.0

    def summary(self) -> dict[str, Any]:
        def share(n: int, of: int) -> float | None:
            return round(n / of, 4) if of else None

        sides = {}
        for s in SIDES:
            times = {k: {"p50": percentile(v, 0.5), "p99": percentile(v, 0.99)} for k, v in self.times[s].items()}
            per_m = self.cost[s] / self.tokens[s] * 1e6 if self.tokens[s] else None
            sides[NAMES[s]] = {
                "budgets_met": share(self.met[s], self.budgeted),
                **times,
                "completion_tokens": self.tokens[s],
                "finish_reasons": dict(sorted(self.finish[s].items())),
                "cost_usd": self.cost[s],
                "cost_per_million_tokens": None if per_m is None else round(per_m, 4),
            }
        return {
            "pairs": self.pairs,
            "shadow_failures": self.failed,
            "compared": self.compared,
            "agreement": share(self.agreed, self.compared),
            "mean_similarity": round(sum(self.scores) / len(self.scores), 4) if self.scores else None,
            "with_budget": self.budgeted,
            **sides,
        }


def summarize(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (rule, primary backend, candidate backend), in that order."""
    groups: dict[tuple[str, str, str], _Group] = {}
    for doc in records:
        key = (str(doc.get("rule")), str(doc["primary"].get("backend")), str(doc["shadow"].get("backend")))
        groups.setdefault(key, _Group()).add(doc)
    return [
        {
            "rule": rule,
            "primary_backend": primary,
            "candidate_backend": candidate,
            **groups[(rule, primary, candidate)].summary(),
        }
        for rule, primary, candidate in sorted(groups)
    ]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def render(rows: list[dict[str, Any]]) -> str:
    """The summary as text, one block per group."""
    if not rows:
        return "no shadow comparisons\n"
    out = []
    for row in rows:
        p, s = row["primary"], row["candidate"]
        out += [
            f"rule {row['rule']}: {row['primary_backend']} (primary) vs {row['candidate_backend']} (candidate)",
            f"  pairs {row['pairs']}, candidate failures {row['shadow_failures']}, agreement "
            f"{_pct(row['agreement'])} of {row['compared']} compared (mean similarity {_num(row['mean_similarity'])})",
            f"  budgets met: candidate {_pct(s['budgets_met'])} vs primary {_pct(p['budgets_met'])} "
            f"(of {row['with_budget']} pairs with a budget)",
            f"  {'':22}{'primary':>18}{'candidate':>18}",
        ]
        for key, label in (("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"), ("e2e_ms", "end-to-end ms")):
            cells = [f"{_num(side[key]['p50'])} / {_num(side[key]['p99'])}" for side in (p, s)]
            out.append(f"  {label + ' p50/p99':22}{cells[0]:>18}{cells[1]:>18}")
        out.append(f"  {'completion tokens':22}{p['completion_tokens']:>18}{s['completion_tokens']:>18}")
        out.append(f"  {'cost':22}{p['cost_usd']:>18.8f}{s['cost_usd']:>18.8f}")
        per_m = [f"{side['cost_per_million_tokens']:.4f}" if side["cost_per_million_tokens"] is not None else "-"
                 for side in (p, s)]  # fmt: skip
        out.append(f"  {'cost per 1M tokens':22}{per_m[0]:>18}{per_m[1]:>18}")
        for name, side in (("primary", p), ("candidate", s)):
            reasons = ", ".join(f"{k} {v}" for k, v in side["finish_reasons"].items())
            out.append(f"  finish reasons ({name}): {reasons}")
        out.append("")
    return "\n".join(out)


def _report(args: argparse.Namespace) -> int:
    path: Path = args.file
    try:
        rows = summarize(read(path))
    except OSError as exc:
        print(f"enginegate shadow report: {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(render(rows))
    return 0


def add_parser(sub: Any) -> None:
    """``enginegate shadow report FILE [--json]``."""
    shadow = sub.add_parser("shadow", help="shadow traffic: compare a candidate engine with the primary")
    shadow_sub = shadow.add_subparsers(dest="shadow_command", required=True)
    report = shadow_sub.add_parser("report", help="summarise the comparisons of shadow.log_path")
    report.add_argument("file", type=Path, help="the JSON-lines file of shadow.log_path")
    report.add_argument("--json", action="store_true", help="the summary as JSON")
    report.set_defaults(func=_report)
