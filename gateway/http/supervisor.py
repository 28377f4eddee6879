"""``serve --workers N``: uvicorn's worker supervisor with the gateway's meaning of its signals.

- **SIGHUP** reloads the config in every worker (forwarded to each; a worker's lifespan reloads on
  it), where uvicorn's own supervisor would restart every worker, dropping their pools, learned
  estimates and breakers for a config change.
- **SIGTERM** (or SIGINT, without the delay) drains: each worker drains itself (``gateway/http/drain.py``);
  after ``server.drain_delay_s`` the supervisor shuts the listening socket all workers share down,
  so new connections are refused rather than left in its backlog. The workers never touch that
  socket themselves: one that is restarted alone (it died) must not take the others' listener.

Only the signal handling is ours; starting, watching and replacing workers stay uvicorn's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time

from uvicorn import Config
from uvicorn.supervisors import Multiprocess

log = logging.getLogger("enginegate.supervisor")

SUPERVISOR_ENV = "ENGINEGATE_SUPERVISOR_PID"
"""Set for workers: the supervisor's pid, so an admin reload in one worker reaches the others."""


class Supervisor(Multiprocess):
    def __init__(self, config: Config, sockets: list[socket.socket], drain_delay_s: float) -> None:
        super().__init__(config, sockets)
        self._drain_delay_s = drain_delay_s
        self._delay_s = drain_delay_s

    def handle_hup(self) -> None:
        log.info("SIGHUP: reloading the config in every worker")
        for process in self.processes:
            if process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGHUP)

    def handle_int(self) -> None:
        self._delay_s = 0.0
        super().handle_int()

    def terminate_all(self) -> None:
        super().terminate_all()  # each worker drains: /readyz 503 at once, its requests get their grace
        time.sleep(self._delay_s)  # the supervisor's own thread: load balancers notice meanwhile
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # one socket in every process: new connections refused


def run(config: Config, drain_delay_s: float) -> None:
    """Bind the socket and supervise ``config.workers`` workers until SIGTERM or SIGINT."""
    sock = config.bind_socket()
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    Supervisor(config, [sock], drain_delay_s).run()
