"""Routing rules' ``match: {keys, teams}`` carried from the config into ``routing.Rule``.

``gateway/catalog.rules`` builds the rules from the config; this adds the two tenancy fields so a
rule scoped to a team never matches everyone. (Folding it into ``catalog.rules`` would do the same.)
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from routing.types import Rules

if TYPE_CHECKING:
    from gateway.config import RuleConfig


def with_key_match(rules: Rules, configs: list[RuleConfig]) -> Rules:
    if not any(c.match.keys or c.match.teams for c in configs):
        return rules
    by_name = {c.name: c for c in configs}
    built = []
    for rule in rules.rules:
        cfg = by_name.get(rule.name)
        if cfg is not None and (cfg.match.keys or cfg.match.teams):
            rule = replace(rule, keys=tuple(cfg.match.keys), teams=tuple(cfg.match.teams))
        built.append(rule)
    return replace(rules, rules=tuple(built))
