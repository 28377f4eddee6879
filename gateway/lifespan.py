"""The gateway's lifespan: what starts before the first request and stops after the last.

Its own module because it is an async generator (``contextlib.asynccontextmanager``), which mypyc
does not compile, and ``gateway.app`` is on the compiled request path (setup.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette

from gateway.state import AppState


def lifespan_of(state: AppState) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """Poll the fleet while serving; SIGHUP reloads the config file."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if state.tenancy is not None:
            await state.tenancy.start()  # the key database (and its schema) before the first request
        await state.fleet.start()
        # Everything built so far (modules, config, engines) lives as long as the process: kept out of
        # the collector's reach, a full collection no longer walks it (they took 50-100 ms here).
        gc.collect()
        gc.freeze()
        loop = asyncio.get_running_loop()
        reloads: set[asyncio.Task[list[str]]] = set()

        def on_sighup() -> None:
            task = loop.create_task(state.reload())
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # signals: main thread only
            loop.add_signal_handler(signal.SIGHUP, on_sighup)
        try:
            yield
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGHUP)
            await state.shadows.aclose()  # before the engines' connections close under them
            await state.fleet.aclose()
            if state.tenancy is not None:
                await state.tenancy.aclose()  # the last usage written
            if state.cache is not None:
                await state.cache.store.aclose()
            state.metrics.close()
            if state.tracing is not None:  # the spans still batched go out before the process ends
                await asyncio.to_thread(state.tracing.shutdown)

    return lifespan
