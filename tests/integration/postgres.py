"""A real PostgreSQL for the lake tests: Debian's server, a temporary cluster, loopback.

``scripts/postgres.sh run DATA_DIR PORT`` makes the cluster (initdb, trust auth on
127.0.0.1) and execs the server in the foreground, so the process started here is the
postmaster itself: :meth:`PostgresProcess.kill` is a real ``kill -9`` and
:meth:`PostgresProcess.restart` brings the same cluster back on the same port.
``scripts/services.sh`` installs the package; a missing server skips the test, except
under ``CI=true``, where it fails.

Example::

    with start_postgres(tmp_path) as pg:
        pg.create_database("lake")
        target = LakeTarget(pg.catalog("lake"), str(tmp_path / "data") + "/")
"""

from __future__ import annotations

import atexit
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psycopg

from .services import ServiceError, _live, _missing, _tail, _terminate, free_port, poll_until

__all__ = ["PostgresProcess", "start_postgres"]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "postgres.sh"


def _installed() -> bool:
    return (
        subprocess.run(["bash", str(SCRIPT), "bindir"], capture_output=True, check=False).returncode
        == 0
    )


@dataclass
class PostgresProcess:
    """A running PostgreSQL cluster on ``127.0.0.1:port`` (user ``postgres``, no password)."""

    data_dir: Path
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def dsn(self, dbname: str = "postgres") -> str:
        """The libpq key=value connection string of ``dbname``."""
        return f"dbname={dbname} host=127.0.0.1 port={self.port} user=postgres"

    def catalog(self, dbname: str) -> str:
        """The DuckLake catalog string for ``dbname`` (``postgres:`` + the DSN)."""
        return "postgres:" + self.dsn(dbname)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return _tail(self.log_path)

    def create_database(self, dbname: str) -> None:
        """``CREATE DATABASE dbname`` (autocommit)."""
        with psycopg.connect(self.dsn(), autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{dbname}"')

    def start(self, ready_timeout_seconds: float = 60.0) -> None:
        """Start (or start again) the server on the same data dir and port; wait until ready."""
        if self.running:
            return
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["bash", str(SCRIPT), "run", str(self.data_dir), str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        _live.add(self.proc)

        def ready() -> bool:
            if not self.running:
                code = None if self.proc is None else self.proc.returncode
                raise ServiceError(f"postgres exited with {code}; log:\n{self.log_text()}")
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return True
            except psycopg.OperationalError:
                return False

        try:
            poll_until(ready, timeout_seconds=ready_timeout_seconds, what="postgres to accept")
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_seconds: float = 30.0) -> None:
        """A fast shutdown (SIGINT: abort transactions, checkpoint, exit)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        _terminate(self.proc, timeout_seconds)

    def kill(self) -> None:
        """``kill -9`` of the postmaster; its backends end when they notice (crash restart
        happens on the next :meth:`start`)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            _live.discard(self.proc)

    def restart(self) -> None:
        """Stop (fast) and start again on the same port and data dir."""
        self.stop()
        self.start()

    def __enter__(self) -> PostgresProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_postgres(tmp_path: Path) -> PostgresProcess:
    """Start a fresh cluster under ``tmp_path`` on a free loopback port; wait until ready.

    Raises:
        ServiceError: the server exited or did not accept connections within 60 s.
    """
    if not _installed():
        _missing("PostgreSQL", "`bash scripts/postgres.sh install`")
    # As root the server runs as `postgres`, which must traverse every folder above its
    # data. pytest's own base folder is 0700 and another pytest session on the machine
    # resets it at any time, so the cluster lives in its own folder under the system's
    # temporary directory, removed at exit; ``tmp_path`` gets a link to it for debugging.
    root = Path(tempfile.mkdtemp(prefix="lw-postgres-"))
    root.chmod(0o711)
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    link = tmp_path / f"postgres-{len(list(tmp_path.glob('postgres-*')))}"
    link.symlink_to(root, target_is_directory=True)
    pg = PostgresProcess(root / "data", free_port(), root / "postgres.log")
    pg.start()
    return pg
