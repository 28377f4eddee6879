"""Real ``redis-server`` and PostgreSQL for the tenancy tests: each on a free port in a temporary
directory, started by the test and stopped after it (Debian's packages; ``make services``
installs them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import free_port
from tests.polling import wait_until


def _pg_bin() -> Path:
    """The newest installed PostgreSQL's programs (Debian keeps them per major version)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()


class RedisServer:
    """``persistent``: every write is in the append-only file before it is acknowledged, so a stop and a
    start keep the data (else a restart starts empty)."""

    def __init__(self, directory: Path, persistent: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make services)")
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._binary = binary
        self.persistent = persistent
        self.start()

    def start(self) -> None:
        durable = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        args = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *durable,
                "--dir", str(self.directory)]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.ping, timeout=20, interval=0.05, message="redis-server did not start within 20s")

    def ping(self) -> bool:
        cli = shutil.which("redis-cli")
        if cli is None:
            import socket

            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False
        done = subprocess.run([cli, "-p", str(self.port), "ping"], capture_output=True, text=True)
        return done.stdout.strip() == "PONG"

    def call(self, *args: str) -> str:
        """One command through ``redis-cli``; its output."""
        cli = shutil.which("redis-cli")
        assert cli is not None, "redis-cli is not installed (make services)"
        done = subprocess.run([cli, "-p", str(self.port), *args], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _as_postgres(args: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its tools as the ``postgres`` user then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *args]
    return args


class Postgres:
    """A throwaway cluster: initdb, pg_ctl start on a free port (socket in the same directory), trust auth."""

    def __init__(self) -> None:
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError("PostgreSQL is not installed (make services)")
        self.directory = Path(tempfile.mkdtemp(prefix="eg-pg-"))
        self.data = self.directory / "data"
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]),
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", options, "-l",
                          str(self.directory / "log"), "-w", "start"]),
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]),
            check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        shutil.rmtree(self.directory, ignore_errors=True)
