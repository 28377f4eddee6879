"""A config as the simulator's fleet and as an idle fleet snapshot for ``routing.choose``."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.config import LoadedConfig, parse_config
from gateway.fleet.catalog import capabilities, model_specs, profile, rules
from gateway.fleet.engines import configured_capabilities
from routing.sim.simulate import Outage, SimFleet
from routing.types import BackendState, FleetSnapshot


def sim_fleet(loaded: LoadedConfig, outages: Sequence[str] | None = None) -> SimFleet:
    """The config's generating backends, models and routing rules as the simulator's fleet (polled like
    the gateway). ``outages``: ``BACKEND:START_S:END_S`` strings; ValueError naming a bad one."""
    parsed = []
    names = {b.name for b in loaded.config.backends}
    for text in outages or []:
        name, start, end = [*text.rsplit(":", 2), "", ""][:3]
        try:
            outage = Outage(name, float(start), float(end))
        except ValueError:
            raise ValueError(f"--outage {text!r}: expected BACKEND:START_S:END_S") from None
        if name not in names or not outage.end_s > outage.start_s >= 0:
            raise ValueError(f"--outage {text!r}: unknown backend or empty interval")
        parsed.append(outage)
    generating = [b for b in loaded.config.backends if loaded.model(b.model).kind == "generate"]
    return SimFleet(
        profiles=tuple(profile(b, loaded) for b in generating),
        models=model_specs(loaded),
        rules=rules(loaded),
        poll_s=loaded.config.limits.health_interval_s,
        outages=tuple(parsed),
        # The gateway's admission limit, applied by the simulated fleet to every policy alike.
        admission_s=loaded.config.routing.max_queue_wait_s,
    )


def idle_snapshot(loaded: LoadedConfig) -> FleetSnapshot:
    """Every backend of the config healthy and idle, with the capabilities its config declares (what
    ``route explain`` ranks against): the same fleet state for two configs compared."""
    return FleetSnapshot(
        tuple(
            BackendState(profile(b, loaded, caps=capabilities(configured_capabilities(b), b, loaded.model(b.model))))
            for b in loaded.config.backends
        ),
        model_specs(loaded),
    )


def from_text(text: str, source: str, beside: LoadedConfig) -> LoadedConfig:
    """YAML text as a config whose relative paths resolve next to ``beside``'s file (a config sent to
    the admin API); ConfigError with ``source:LINE: path: message`` problems."""
    config, _ = parse_config(text, source)
    return LoadedConfig(config, beside.path, beside.ggufs)
