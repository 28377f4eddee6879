"""The chaos run: the fleet of fakes, a real gateway in front of it, the clients, the fault timeline.

``ENGINEGATE_CHAOS_GATEWAY_ROOT`` runs the gateway from another source tree (say an export of an older
commit, for before/after figures) against this tree's fakes and checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from tests import conftest
from tests.chaos.clients import CLIENT_DEADLINE_S, Result, send
from tests.chaos.fleet import ADMIN_ENV, ADMIN_KEY, BACKENDS, FakeProcess, Upstream, gateway_config
from tests.chaos.schedule import Event, Plan, Spec
from tests.chaos.tally import RECOVERY_BOUND_S, Recovery

FAULT_RATE = 0.3
"""Share of client requests' upstream POSTs that get a per-request fault."""
PROBE_EVERY_S = 0.25
END_POLL_S = 10.0
RELOAD_SEEN_S = 10.0
BURST_FAILURES = 8
"""Failed attempts a burst aims for on its backend: above the breaker's threshold (5)."""


@contextlib.contextmanager
def gateway_root(root: Path | None) -> Iterator[None]:
    """``GatewayProcess`` runs ``python -m gateway.cli`` in ``conftest.ROOT``: point it elsewhere meanwhile."""
    if root is None:
        yield
        return
    saved, conftest.ROOT = conftest.ROOT, root
    try:
        yield
    finally:
        conftest.ROOT = saved


@dataclass
class Outcome:
    results: list[Result]
    upstream: list[Upstream]
    recoveries: list[Recovery]
    open_at_end: dict[str, int]
    reloads: list[str]
    transitions: list[str]
    log: Path
    elapsed_s: float


@dataclass
class Chaos:
    plan: Plan
    workdir: Path
    cache_dir: Path
    fakes: dict[str, FakeProcess] = field(default_factory=dict)
    read_timeouts: dict[str, float] = field(default_factory=dict)
    gateway: conftest.GatewayProcess | None = None
    results: list[Result] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    reloads: list[str] = field(default_factory=list)
    transitions: list[str] = field(default_factory=list)
    probes: int = 0

    @property
    def config(self) -> Path:
        return self.workdir / "chaos.yaml"

    def start(self) -> None:
        self.fakes = {
            name: FakeProcess(name, kind, self.workdir, self.plan.seed, FAULT_RATE) for name, kind in BACKENDS.items()
        }
        for fake in self.fakes.values():
            fake.start()

        async def all_ready() -> None:
            async with httpx.AsyncClient() as client:
                await asyncio.gather(*(f.ready(client, timeout=90) for f in self.fakes.values()))

        asyncio.run(all_ready())
        self.read_timeouts = dict.fromkeys(self.fakes, 20.0)
        conftest.write_config(self.config, gateway_config(self.fakes, self.read_timeouts))
        root = os.environ.get("ENGINEGATE_CHAOS_GATEWAY_ROOT")
        with gateway_root(Path(root) if root else None):
            self.gateway = conftest.GatewayProcess(self.config, self.cache_dir, env={ADMIN_ENV: ADMIN_KEY})

    def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for fake in self.fakes.values():
            fake.stop()

    @property
    def base(self) -> str:
        assert self.gateway is not None
        return self.gateway.base_url

    async def run(self) -> Outcome:
        t0 = time.monotonic()
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
        async with httpx.AsyncClient(timeout=CLIENT_DEADLINE_S + 5, limits=limits) as client:
            sdk = openai.AsyncOpenAI(
                base_url=f"{self.base}/v1", api_key="unused", max_retries=0, timeout=CLIENT_DEADLINE_S + 5
            )
            side: list[asyncio.Task[None]] = []
            monitor = asyncio.create_task(self._watch_fleet(t0, client))
            workers = [self._worker(specs, t0, client, sdk) for specs in self.plan.workers]
            await asyncio.gather(self._timeline(t0, client, sdk, side), *workers)
            await asyncio.gather(*side)
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
            open_at_end = await self._drained(client)
            await sdk.close()
        assert self.gateway is not None
        upstream = [u for fake in self.fakes.values() for u in fake.upstream()]
        elapsed = time.monotonic() - t0
        return Outcome(
            self.results, upstream, self.recoveries, open_at_end, self.reloads, self.transitions, self.gateway.log,
            elapsed,
        )  # fmt: skip

    async def _worker(self, specs: list[Spec], t0: float, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI) -> None:
        for spec in specs:
            await _until(t0 + spec.at)
            self.results.append(await send(spec, self.base, client, sdk))

    async def _timeline(
        self, t0: float, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI, side: list[asyncio.Task[None]]
    ) -> None:
        for event in self.plan.events:
            await _until(t0 + event.at)
            if event.kind == "reload":
                await self._reload(event, client)
            else:
                side.append(asyncio.create_task(self._fault(event, client, sdk)))

    async def _fault(self, event: Event, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI) -> None:
        assert event.backend is not None
        fake = self.fakes[event.backend]
        if event.kind == "kill":
            fake.kill()
            await asyncio.sleep(event.seconds)  # the engine's downtime, part of the schedule
            fake.start()
            back = await fake.ready(client, timeout=60)
            await self._recover(Recovery(event.backend, event.seconds, back), client, sdk)
            return
        if event.kind == "burst":
            await self._burst(event, fake, client, sdk)
            return
        knob = {"unhealthy": "healthy", "slow": "token_delay_s", "queue": "delay_s"}[event.kind]
        on, off = (False, True) if knob == "healthy" else (event.value, 0.0)
        await fake.knobs(client, **{knob: on})
        await asyncio.sleep(event.seconds)  # the window's length, part of the schedule
        await fake.knobs(client, **{knob: off})

    async def _burst(self, event: Event, fake: FakeProcess, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI) -> None:
        """Every POST to ``fake`` fails (500) while probes that prefer it keep coming, so its breaker sees
        a run of failures; then the engine is fine again and must get traffic back within the bound."""
        assert event.backend is not None
        await fake.knobs(client, burst="status_500")
        began = time.monotonic()
        deadline = began + event.seconds
        failed_there = 0
        while time.monotonic() < deadline and failed_there < BURST_FAILURES:
            before = (await fake.state(client))["posts"]
            self.results.append(await send(self._probe(event.backend), self.base, client, sdk))
            failed_there += (await fake.state(client))["posts"] > before
            if failed_there and not (await self._fleet_state(client, event.backend)).endswith("closed)"):
                break  # the breaker left closed: the blip has done its work
            await asyncio.sleep(PROBE_EVERY_S / 5)  # probe pacing; the loop's deadline bounds it
        await fake.knobs(client, burst=None)
        back = time.monotonic()
        await self._recover(Recovery(event.backend, round(back - began, 2), back, kind="burst"), client, sdk)

    def _probe(self, backend: str) -> Spec:
        self.probes += 1
        return Spec(f"probe-{self.plan.seed}-{self.probes}", 0.0, True, False, False, 8, None, probe=backend)

    async def _recover(self, rec: Recovery, client: httpx.AsyncClient, sdk: openai.AsyncOpenAI) -> None:
        """Probe until a request is answered by the restarted backend (measured past the bound, to report)."""
        self.recoveries.append(rec)
        deadline = rec.back_at + RECOVERY_BOUND_S + 10
        while time.monotonic() < deadline:
            seen = await self._fleet_state(client, rec.backend)
            if not rec.fleet_seen or rec.fleet_seen[-1] != seen:
                rec.fleet_seen.append(seen)
            rec.probes += 1
            result = await send(self._probe(rec.backend), self.base, client, sdk)
            self.results.append(result)
            if result.outcome == "completed" and result.backend == rec.backend:
                rec.recovered_at = time.monotonic()
                return
            await asyncio.sleep(PROBE_EVERY_S)  # probe pacing; the loop's deadline bounds it

    async def _watch_fleet(self, t0: float, client: httpx.AsyncClient) -> None:
        """Every change of a backend's (healthy, breaker) in /admin/fleet, timed from the run's start: the
        evidence for recoveries (the gateway itself logs no transitions)."""
        last: dict[str, str] = {}
        while True:
            for name in self.fakes:
                seen = await self._fleet_state(client, name)
                if last.get(name) != seen:
                    last[name] = seen
                    self.transitions.append(f"{time.monotonic() - t0:.1f}s {name} {seen}")
            await asyncio.sleep(0.1)  # sampling interval of the watch

    async def _fleet_state(self, client: httpx.AsyncClient, name: str) -> str:
        try:
            doc = (await client.get(f"{self.base}/admin/fleet", headers=_admin(), timeout=5)).json()
            return f"({doc[name]['healthy']}, {doc[name]['breaker']})"
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            return f"?{type(exc).__name__}"

    async def _reload(self, event: Event, client: httpx.AsyncClient) -> None:
        """Rewrite the config (rebuilding ``event.backend``: one of its settings changes) and reload it."""
        assert self.gateway is not None
        if event.backend is not None:
            self.read_timeouts[event.backend] = 41.0 - self.read_timeouts[event.backend]  # 20 <-> 21
        conftest.write_config(self.config, gateway_config(self.fakes, self.read_timeouts))
        label = f"{event.via}:{event.backend or 'unchanged'}"
        if event.via == "admin":
            r = await client.post(f"{self.base}/admin/reload", headers=_admin(), timeout=10)
            self.reloads.append(f"{label}={r.status_code}")
            return
        before = await _reload_count(client, self.base)
        os.kill(self.gateway.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + RELOAD_SEEN_S
        while (after := await _reload_count(client, self.base)) <= before and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # polls another process's counter, with a deadline
        self.reloads.append(f"{label}={'ok' if after > before else 'unseen'}")

    async def _drained(self, client: httpx.AsyncClient) -> dict[str, int]:
        """Open upstream streams per fake, polled until none or END_POLL_S."""
        deadline = time.monotonic() + END_POLL_S
        while True:
            counts = {name: int((await fake.state(client))["open"]) for name, fake in self.fakes.items()}
            if not any(counts.values()) or time.monotonic() >= deadline:
                return counts
            await asyncio.sleep(0.1)  # polled with a deadline


def _admin() -> dict[str, str]:
    return {"authorization": f"Bearer {ADMIN_KEY}"}


async def _reload_count(client: httpx.AsyncClient, base: str) -> float:
    text = (await client.get(f"{base}/metrics", timeout=5)).text
    m = re.search(r'^enginegate_config_reloads_total\{outcome="ok"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def _until(at: float) -> None:
    """Wait for a moment of the schedule (the plan's timing, not a synchronization)."""
    delay = at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
