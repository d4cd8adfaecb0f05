"""A PostgreSQL server of a test's own, to stop and start under running workers: the shared
server (DATABASE_URL) serves every other test and lane, and is never stopped.

``PostgresCluster`` runs ``initdb`` and ``pg_ctl`` (the server's own binaries, found under
/usr/lib/postgresql or by ``pg_config``) in a temporary directory, on a free port of 127.0.0.1
with no Unix socket, as the ``postgres`` OS user when the test runs as root (PostgreSQL refuses
to run as root). ``take_over`` copies the test database into it (pg_dump, so with what the
test's fixtures wrote) and points this thread's connection at the copy; processes started
after it (``tests.support.processes``) use it too, as they take their URL from that
connection.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import suppress
from glob import glob
from pathlib import Path

from django.db import connection

from tests.support.net import free_port

DATABASE = "coevo"


def postgres_bin_dir() -> Path | None:
    """The directory of this machine's ``initdb`` and ``pg_ctl``, or None without a server."""
    for directory in sorted(glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True):
        if Path(directory, "initdb").exists():
            return Path(directory)
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if found.returncode == 0 and Path(found.stdout.strip(), "initdb").exists():
            return Path(found.stdout.strip())
    return None


def _version(directory: str) -> int:
    name = Path(directory).parent.name
    return int(name) if name.isdigit() else 0


class PostgresCluster:
    """A private PostgreSQL server: ``start``, ``stop`` (fast shutdown: sessions are ended, as
    when the server is stopped or restarted in production) and ``destroy``."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        # Not under pytest's tmp_path: its directories are private to root, and the server runs
        # as the postgres user.
        self.root = Path(tempfile.mkdtemp(prefix="coevo-pg-"))
        self.data = self.root / "data"
        self.log_path = self.root / "server.log"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, user="postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-instructions")  # fmt: skip
        with open(self.data / "postgresql.conf", "a") as conf:
            # Durability is not what the test is about; speed is, on a shared machine.
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                "unix_socket_directories = ''\nfsync = off\nsynchronous_commit = off\n"
                "full_page_writes = off\nmax_connections = 100\n"
            )
        self._original: dict | None = None

    def _run(self, program: str, *args: str) -> subprocess.CompletedProcess:
        command = [str(self.bin_dir / program), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed: {done.stderr or done.stdout}")
        return done

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def take_over(self) -> None:
        """Copy the test database (schema and rows) here and point this thread's connection of
        ``default`` at the copy, until ``destroy``."""
        source = connection.settings_dict
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", DATABASE)
        dump = subprocess.run(
            [str(self.bin_dir / "pg_dump"), "--no-owner", "--no-privileges",
             "-h", source["HOST"] or "127.0.0.1", "-p", str(source["PORT"] or 5432),
             "-U", source["USER"], source["NAME"]],
            capture_output=True, check=True, timeout=120,
            env={**os.environ, "PGPASSWORD": source.get("PASSWORD") or ""},
        )  # fmt: skip
        subprocess.run(
            [str(self.bin_dir / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
             "-p", str(self.port), "-U", "postgres", "-d", DATABASE],
            input=dump.stdout, capture_output=True, check=True, timeout=120,
        )  # fmt: skip
        connection.close()
        self._original = source
        connection.settings_dict = {
            **source, "HOST": "127.0.0.1", "PORT": str(self.port), "NAME": DATABASE,
            "USER": "postgres", "PASSWORD": "",
        }  # fmt: skip

    def destroy(self) -> None:
        """Give this thread's connection its database back; stop the server; remove it all."""
        if self._original is not None:
            connection.close()
            connection.settings_dict = self._original
            self._original = None
        with suppress(RuntimeError):  # already stopped
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
