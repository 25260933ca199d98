"""Collector configuration: frozen dataclasses, validated, with one precedence rule.

Precedence, highest first: command-line flags > environment > TOML file > defaults.
Environment variables are ``LOOPWATCH_<SECTION>_<FIELD>`` (e.g.
``LOOPWATCH_SERVER_OTLP_HTTP=127.0.0.1:14318``, ``LOOPWATCH_SAMPLING_COMPLETED_FRACTION=0.2``);
``LOOPWATCH_LAKE`` and ``LOOPWATCH_LAKE_DATA`` are short for ``LOOPWATCH_LAKE_CATALOG`` and
``LOOPWATCH_LAKE_DATA_PATH``.
The TOML file has one table per section::

    [server]
    otlp_http = "127.0.0.1:4318"
    http = "127.0.0.1:9464"
    token_file = "/etc/loopwatch/token"

    [store]
    db = "./loopwatch.duckdb"

    [lake]
    catalog = "postgres:dbname=lake host=127.0.0.1 port=5432"
    data_path = "/var/lib/loopwatch/lake/"
    local_retention_seconds = "7d"

Every problem is reported at once as a :class:`~loopwatch.collector.errors.ConfigError`;
the CLI prints it as one line and exits with code 2. Secrets (the token, the HMAC key)
print as ``**********``.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final

from .errors import ConfigError
from .lake.connect import mask_catalog
from .store.settings import DUCKDB_ROW_GROUP_ROWS, VECTOR_ROWS

__all__ = [
    "LOG_LEVELS",
    "CollectorConfig",
    "LakeConfig",
    "LakeHousekeepingConfig",
    "load_config",
    "parse_duration_seconds",
    "parse_hostport",
]

_SECRET_MASK: Final = "**********"
_MAX_RETENTION_DAYS: Final = 36_500


def parse_hostport(value: str, *, what: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6).

    Raises:
        ConfigError: not a host and a port in 0..65535.
    """
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(what, f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(what, f"port is not a number in {value!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(what, f"port out of range in {value!r}")
    return host, port


_MIN_MEMORY_LIMIT_MIB: Final = 64
_MAX_DUCKDB_THREADS: Final = 64


def _validate_memory(store: StoreConfig) -> None:
    """The memory budgets of ``[store]``.

    Raises:
        ConfigError: a budget is not a whole number in its range.
    """
    for name, value, low, high in (
        ("store.memory_limit_mib", store.memory_limit_mib, _MIN_MEMORY_LIMIT_MIB, 1 << 20),
        ("store.checkpoint_wal_mib", store.checkpoint_wal_mib, 1, 1 << 20),
        ("store.duckdb_threads", store.duckdb_threads, 1, _MAX_DUCKDB_THREADS),
        ("store.dedup_window_mib", store.dedup_window_mib, 1, 1 << 20),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(name, f"must be a whole number in {low}..{high}")
    rows = store.row_group_rows
    if (
        isinstance(rows, bool)
        or not isinstance(rows, int)
        or not 0 <= rows <= DUCKDB_ROW_GROUP_ROWS
        or rows % VECTOR_ROWS
    ):
        raise ConfigError(
            "store.row_group_rows",
            f"must be 0 (by DuckDB version) or a multiple of {VECTOR_ROWS} "
            f"up to {DUCKDB_ROW_GROUP_ROWS}",
        )


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerConfig:
    """Listening addresses and access.

    Attributes:
        otlp_http: OTLP/HTTP receiver ``HOST:PORT`` (``/v1/traces``).
        otlp_grpc: OTLP/gRPC receiver ``HOST:PORT`` (``TraceService/Export``, usually
            ``127.0.0.1:4317``); empty (the default): off.
        http: ``/metrics``, ``/healthz`` and the read API ``HOST:PORT``.
        token_file: file holding a bearer token required on OTLP and the API.
        allow_non_loopback: binding a non-loopback address needs this set (the default
            bind is loopback only).
        backpressure_status_code: 503 (default) or 429 when the queue is full.
        retry_after_seconds: the ``Retry-After`` sent with it.
    """

    otlp_http: str = "127.0.0.1:4318"
    otlp_grpc: str = ""
    http: str = "127.0.0.1:9464"
    token_file: str = ""
    allow_non_loopback: bool = False
    backpressure_status_code: int = 503
    retry_after_seconds: int = 1


@dataclass(frozen=True)
class LimitsConfig:
    """Request limits: ``max_body_bytes`` (compressed) and ``max_decompressed_bytes`` per
    request; ``max_inflight_bytes``: request bodies held at once by all receivers, from
    arrival to answer (past it, requests are refused as throttling before decoding)."""

    max_body_bytes: int = 20 * 1024 * 1024
    max_decompressed_bytes: int = 64 * 1024 * 1024
    max_inflight_bytes: int = 32 * 1024 * 1024


@dataclass(frozen=True)
class StoreConfig:
    """DuckDB storage.

    Attributes:
        db: database file (the embedded default).
        queue_max_batches: mapped batches waiting for the writer before backpressure.
        query_timeout_seconds: time limit of every read query.
        max_rows: row cap of every read query.
        retention_days: runs whose last span arrived longer ago are removed, steps and
            stops included (counter totals stay); ``0`` keeps everything.
        memory_limit_mib: DuckDB's memory limit (``SET memory_limit``): its block cache
            and working memory; past it DuckDB evicts cached blocks and spills to
            ``<db>.tmp``. Key indexes come on top (since schema 21 only
            ``canary_flags``' is left: a few rows).
        checkpoint_wal_mib: write-ahead log size at which the writer checkpoints. Rows
            not yet checkpointed stay in DuckDB's memory, so a smaller log keeps the
            sidecar smaller; each checkpoint blocks the writer for a time that grows with
            the file, not the log.
        duckdb_threads: DuckDB worker threads (each may hold its own working memory).
        dedup_window_mib: memory for the span keys of the dedup window (retried requests
            are recognised in memory, ``collector/store/keys.py``): 24 bytes a key, so
            the default 16 MiB holds about 0.7 million keys.
        row_group_rows: rows per DuckDB row group the writer appends; 0 (the default)
            chooses by DuckDB version: 16,384 from 1.5.6 on, DuckDB's 122,880 before
            (:func:`loopwatch.collector.store.settings.default_row_group_rows`).
    """

    db: str = "./loopwatch.duckdb"
    queue_max_batches: int = 256
    query_timeout_seconds: float = 5.0
    max_rows: int = 10_000
    retention_days: float = 0.0
    # Memory budgets (docs/collector.md, "Memory"; tests/reliability/test_soak.py): the
    # goal is 300 MiB at half capacity. 32 MiB for DuckDB failed a checkpoint under load.
    memory_limit_mib: int = 64
    checkpoint_wal_mib: int = 16
    duckdb_threads: int = 1
    dedup_window_mib: int = 16
    row_group_rows: int = 0


@dataclass(frozen=True)
class SamplingConfig:
    """Which stopped runs keep their steps (the run row and counts are always kept).

    Attributes:
        completed_fraction: fraction of ``completed`` runs kept (0..1, by run-id hash).
        max_runs_per_reason_tool_per_hour: cap of full runs per (stop reason, tool).
        stop_timeout_seconds: a run whose stop never comes is decided after this long.
    """

    completed_fraction: float = 0.1
    max_runs_per_reason_tool_per_hour: int = 100
    stop_timeout_seconds: float = 900.0


@dataclass(frozen=True)
class RedactionConfig:
    """Redaction: canary file (one value per line, ``#`` comments) and optional HMAC key file."""

    canaries_file: str = ""
    hmac_key_file: str = ""


@dataclass(frozen=True)
class MetricsConfig:
    """Label bounds: names past the top-N become ``_other``."""

    top_n_agents: int = 50
    top_n_tools: int = 200


MAX_DECODE_WORKERS: Final = 64


def default_decode_workers() -> int:
    """``1`` when this process may run on two or more CPUs, else ``0``.

    One worker roughly balances the serving process on two cores (decode + redact cost
    about as much CPU per span as map + store; figures in docs/collector.md); on one CPU a
    worker would only add the hand-off cost.
    """
    return 1 if len(os.sched_getaffinity(0)) >= 2 else 0


@dataclass(frozen=True)
class PipelineConfig:
    """Where the CPU-bound ingest stages run.

    Attributes:
        decode_workers: processes that decompress, decode and redact request bodies
            (``0``: in the serving process). Redacted batches come back to the serving
            process, which maps, stores and acknowledges them. Default:
            :func:`default_decode_workers`.
    """

    decode_workers: int = field(default_factory=default_decode_workers)


LOG_LEVELS: Final = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class LogConfig:
    """Collector logging (stderr).

    Attributes:
        level: ``debug``, ``info``, ``warning`` (default) or ``error``. No level logs span
            content, canary values or the bearer token (``tests/reliability`` checks debug).
    """

    level: str = "warning"


# --- lake shipping (issue 27) -------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$", re.IGNORECASE)
_DURATION_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0}
ENV_ALIASES: Final = {
    "LOOPWATCH_LAKE": ("lake", "catalog"),
    "LOOPWATCH_LAKE_DATA": ("lake", "data_path"),
}
"""Short environment names for the two lake settings everyone sets (the long
``LOOPWATCH_LAKE_CATALOG`` / ``LOOPWATCH_LAKE_DATA_PATH`` win when both are set)."""


def parse_duration_seconds(value: str | float, *, what: str) -> float:
    """Seconds of ``value``: a number of seconds, or ``N`` followed by ``s``, ``m``, ``h``
    or ``d`` (``"90s"``, ``"15m"``, ``"12h"``, ``"7d"``).

    Raises:
        ConfigError: anything else.
    """
    if isinstance(value, bool):
        raise ConfigError(what, "must be a duration such as 90s, 15m, 12h or 7d")
    if isinstance(value, int | float):
        return float(value)
    match = _DURATION.match(value)
    if match is None:
        raise ConfigError(
            what, f"must be a duration such as 90s, 15m, 12h or 7d, got {value[:40]!r}"
        )
    return float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]


@dataclass(frozen=True)
class LakeConfig:
    """Shipping finished runs to a DuckLake (fleet mode; off while ``catalog`` is empty).

    Attributes:
        catalog: the DuckLake catalog after ``ducklake:``, e.g.
            ``postgres:dbname=lake host=127.0.0.1 port=5432 user=loopwatch`` (a password
            in it prints masked), or a local ``catalog.ducklake`` file. Empty: no lake.
        data_path: folder or ``s3://bucket/prefix/`` of the lake's Parquet files; the
            same string for every collector of one lake (DuckLake fixes it at creation).
        extension_directory: where DuckDB loads the DuckLake extensions from when the
            ``loopwatch[lake]`` wheels are absent; empty keeps DuckDB's default.
        collector_id: this collector's name in the lake's ``collector_id`` column; the
            host name by default.
        local_retention_seconds: a run shipped longer ago than this is removed from the
            local file (never an unshipped one); ``0`` (default) keeps shipped runs
            locally until ``store.retention_days``. Accepts ``90s``, ``15m``, ``12h``,
            ``7d``.
        ship_interval_seconds: how often the shipper looks for finished runs.
        ship_grace_seconds: a decided run ships once no span of it arrived for this long
            (late spans of a run land in its local copy only after it shipped).
        ship_batch_runs: runs per lake transaction. A pass costs about the same CPU
            whatever its size (the local reads, a Parquet file per table, the commit:
            143 ms of the shipping thread at 2,000 runs, 259 ms at 10,000), so at
            capacity larger batches cost less per run (72 against 26 us).
        ship_retry_max_seconds: the longest wait between retries of a failed batch
            (backoff doubles from ``ship_interval_seconds``).
        memory_limit_mib: DuckDB's memory limit of each connection this collector opens
            to the lake (the shipper's, and housekeeping's during a round), in MiB. It
            holds the batch being shipped, the Parquet writer's buffers and the cache of
            lake files read by the exactly-once check; past it DuckDB spills to
            ``<store.db>.lake.tmp``. It comes on top of ``store.memory_limit_mib``: a
            sidecar's DuckDB memory is at most the sum (``docs/collector.md``,
            "Memory").
    """

    catalog: str = ""
    data_path: str = ""
    extension_directory: str = ""
    collector_id: str = field(default_factory=socket.gethostname)
    local_retention_seconds: float = 0.0
    ship_interval_seconds: float = 3.0
    ship_grace_seconds: float = 5.0
    ship_batch_runs: int = 10_000
    ship_retry_max_seconds: float = 60.0
    memory_limit_mib: int = 64

    @property
    def enabled(self) -> bool:
        """Whether a lake is configured."""
        return bool(self.catalog.strip())

    def validate(self) -> None:
        """Check the lake settings (offline; reaching the lake is the collector's start).

        Raises:
            ConfigError: naming ``lake.<field>``.
        """
        if not self.enabled:
            if self.data_path:
                raise ConfigError("lake.catalog", "lake.data_path is set but no catalog")
            return
        if not self.data_path.strip():
            raise ConfigError("lake.data_path", "a lake needs its data path (--lake-data)")
        for name in ("catalog", "data_path", "extension_directory"):
            if "'" in getattr(self, name):
                raise ConfigError(f"lake.{name}", "may not contain a single quote")
        if not self.collector_id.strip() or len(self.collector_id) > 200:
            raise ConfigError("lake.collector_id", "must be a name of 1..200 characters")
        if not math.isfinite(self.local_retention_seconds) or self.local_retention_seconds < 0:
            raise ConfigError("lake.local_retention_seconds", "must be >= 0 (0 keeps runs)")
        _positive("lake.ship_interval_seconds", self.ship_interval_seconds)
        _positive("lake.ship_retry_max_seconds", self.ship_retry_max_seconds)
        _positive("lake.ship_batch_runs", self.ship_batch_runs)
        limit = self.memory_limit_mib
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not _MIN_MEMORY_LIMIT_MIB <= limit <= 1 << 20
        ):
            raise ConfigError(
                "lake.memory_limit_mib",
                f"must be a whole number in {_MIN_MEMORY_LIMIT_MIB}..{1 << 20}",
            )
        grace = self.ship_grace_seconds
        if isinstance(grace, bool) or not math.isfinite(grace) or grace < 0:
            raise ConfigError("lake.ship_grace_seconds", "must be a finite number >= 0")


# --- end of lake shipping ------------------------------------------------------------


# --- lake housekeeping (issue 27) ---------------------------------------------------


@dataclass(frozen=True)
class LakeHousekeepingConfig:
    """Lake housekeeping (``collector/lake/housekeeping.py``): one collector of a fleet at a
    time, the holder of a lease in the catalog, merges small files, expires snapshots and
    applies lake retention. Every collector with a lake takes part unless ``enabled`` is
    off.

    Attributes:
        enabled: take part in housekeeping (only when ``[lake]`` is set).
        interval_seconds: time between rounds.
        retention_days: runs whose last span arrived longer ago are removed from the lake,
            with their rows in every lake table; ``0`` (default) keeps everything.
        lease_seconds: how long the lease lasts unrenewed (a killed holder is replaced
            after it); ``0`` (default): twice the interval, at least 60 s.
        snapshot_retention_seconds: lake snapshots older than this are expired (time
            travel ends there).
    """

    enabled: bool = True
    interval_seconds: float = 300.0
    retention_days: float = 0.0
    lease_seconds: float = 0.0
    snapshot_retention_seconds: float = 3_600.0

    def validate(self) -> None:
        """Check the housekeeping settings.

        Raises:
            ConfigError: naming ``lake_housekeeping.<field>``.
        """
        _positive("lake_housekeeping.interval_seconds", self.interval_seconds)
        for name in ("retention_days", "lease_seconds", "snapshot_retention_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"lake_housekeeping.{name}", "must be a finite number >= 0")
        if self.retention_days > _MAX_RETENTION_DAYS:
            raise ConfigError(
                "lake_housekeeping.retention_days", f"must be at most {_MAX_RETENTION_DAYS}"
            )


# --- end of lake housekeeping -------------------------------------------------------


@dataclass(frozen=True)
class CollectorConfig:
    """The whole collector configuration (see the module docstring for precedence)."""

    server: ServerConfig = field(default_factory=ServerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    redaction: RedactionConfig = field(default_factory=RedactionConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    log: LogConfig = field(default_factory=LogConfig)
    lake: LakeConfig = field(default_factory=LakeConfig)
    lake_housekeeping: LakeHousekeepingConfig = field(default_factory=LakeHousekeepingConfig)

    def validate(self) -> CollectorConfig:
        """Check every field; returns ``self``.

        Raises:
            ConfigError: the first problem, naming ``section.field``.
        """
        otlp, http = self.server.otlp_http, self.server.http
        otlp_host, _ = parse_hostport(otlp, what="server.otlp_http")
        http_host, _ = parse_hostport(http, what="server.http")
        listeners = [("server.otlp_http", otlp_host), ("server.http", http_host)]
        if self.server.otlp_grpc:
            grpc_host, grpc_port = parse_hostport(self.server.otlp_grpc, what="server.otlp_grpc")
            listeners.append(("server.otlp_grpc", grpc_host))
            taken = {parse_hostport(a, what="server")[1] for a in (otlp, http)} - {0}
            if grpc_port in taken:
                raise ConfigError(
                    "server.otlp_grpc",
                    f"port {grpc_port} is already used by server.otlp_http or server.http",
                )
        if not self.server.allow_non_loopback:
            for name, host in listeners:
                if not is_loopback(host):
                    raise ConfigError(
                        name,
                        f"{host} is not loopback; set server.allow_non_loopback = true"
                        " to expose it",
                    )
        if self.server.backpressure_status_code not in (429, 503):
            raise ConfigError("server.backpressure_status_code", "must be 429 or 503")
        _positive("server.retry_after_seconds", self.server.retry_after_seconds)
        _positive("limits.max_body_bytes", self.limits.max_body_bytes)
        _positive("limits.max_decompressed_bytes", self.limits.max_decompressed_bytes)
        _positive("limits.max_inflight_bytes", self.limits.max_inflight_bytes)
        _positive("store.queue_max_batches", self.store.queue_max_batches)
        _positive("store.query_timeout_seconds", self.store.query_timeout_seconds)
        _positive("store.max_rows", self.store.max_rows)
        retention = self.store.retention_days
        if isinstance(retention, bool) or not (
            isinstance(retention, int | float) and 0 <= retention <= _MAX_RETENTION_DAYS
        ):
            raise ConfigError(
                "store.retention_days",
                f"must be a number of days in 0..{_MAX_RETENTION_DAYS} (0 keeps everything)",
            )
        if not self.store.db:
            raise ConfigError("store.db", "must name a file")
        _validate_memory(self.store)
        if not 0.0 <= self.sampling.completed_fraction <= 1.0:
            raise ConfigError("sampling.completed_fraction", "must be between 0 and 1")
        _positive(
            "sampling.max_runs_per_reason_tool_per_hour",
            self.sampling.max_runs_per_reason_tool_per_hour,
        )
        _positive("sampling.stop_timeout_seconds", self.sampling.stop_timeout_seconds)
        _positive("metrics.top_n_agents", self.metrics.top_n_agents)
        _positive("metrics.top_n_tools", self.metrics.top_n_tools)
        if not 0 <= self.pipeline.decode_workers <= MAX_DECODE_WORKERS:
            raise ConfigError(
                "pipeline.decode_workers", f"must be a whole number in 0..{MAX_DECODE_WORKERS}"
            )
        if self.log.level.lower() not in LOG_LEVELS:
            raise ConfigError("log.level", "must be one of " + ", ".join(LOG_LEVELS))
        for name, path in (
            ("server.token_file", self.server.token_file),
            ("redaction.canaries_file", self.redaction.canaries_file),
            ("redaction.hmac_key_file", self.redaction.hmac_key_file),
        ):
            if path and not Path(path).is_file():
                raise ConfigError(name, f"no such file: {path}")
        self.lake.validate()
        self.lake_housekeeping.validate()
        return self

    def token(self) -> str | None:
        """The bearer token, read from ``server.token_file`` (None when unset).

        Raises:
            ConfigError: the file is empty or unreadable.
        """
        return _read_secret("server.token_file", self.server.token_file)

    def hmac_key(self) -> bytes | None:
        """The HMAC key for correlating placeholders (None when unset)."""
        secret = _read_secret("redaction.hmac_key_file", self.redaction.hmac_key_file)
        return secret.encode() if secret else None

    def describe(self) -> dict[str, dict[str, Any]]:
        """Every setting, secrets masked (for logs and ``/healthz``)."""
        out: dict[str, dict[str, Any]] = {}
        for section in fields(self):
            values = {}
            for f in fields(getattr(self, section.name)):
                value = getattr(getattr(self, section.name), f.name)
                values[f.name] = (
                    _SECRET_MASK if f.name in ("token_file", "hmac_key_file") and value else value
                )
                if section.name == "lake" and f.name == "catalog":
                    values[f.name] = mask_catalog(value)
            out[section.name] = values
        return out


def _positive(name: str, value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(name, f"must be a finite number > 0, got {value!r}")


def _read_secret(name: str, path: str) -> str | None:
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(name, f"cannot read ({exc.__class__.__name__})") from None
    if not text:
        raise ConfigError(name, "the file is empty")
    return text


_TRUE_WORDS: Final = ("1", "true", "yes", "on")
_FALSE_WORDS: Final = ("0", "false", "no", "off")


def _coerce(section: str, name: str, current: Any, raw: Any, source: str) -> Any:
    where = f"{section}.{name}"
    target = type(current)
    if target is bool:
        if isinstance(raw, bool):
            return raw
        word = raw.strip().lower() if isinstance(raw, str) else None
        if word in _TRUE_WORDS or word in _FALSE_WORDS:
            return word in _TRUE_WORDS
        raise ConfigError(where, f"must be true or false ({source})")
    if target is int:
        if isinstance(raw, bool):
            raise ConfigError(where, f"must be a whole number ({source})")
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise ConfigError(
                where, f"must be a whole number, got {str(raw)[:40]!r} ({source})"
            ) from None
        if isinstance(raw, float) and not raw.is_integer():
            raise ConfigError(where, f"must be a whole number ({source})")
        return value
    if target is float:
        if isinstance(raw, bool):
            raise ConfigError(where, f"must be a number ({source})")
        if section == "lake" and name.endswith("_seconds") and isinstance(raw, str):
            return parse_duration_seconds(raw, what=where)
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise ConfigError(
                where, f"must be a number, got {str(raw)[:40]!r} ({source})"
            ) from None
    if not isinstance(raw, str):
        raise ConfigError(where, f"must be a string ({source})")
    return raw


def _apply(
    config: CollectorConfig, values: Mapping[str, Mapping[str, Any]], source: str
) -> CollectorConfig:
    sections = {f.name for f in fields(config)}
    for section, settings in values.items():
        if section not in sections:
            raise ConfigError(section, f"unknown section ({source})")
        if not isinstance(settings, Mapping):
            raise ConfigError(section, f"must be a table ({source})")
        current = getattr(config, section)
        names = {f.name for f in fields(current)}
        updates = {}
        for name, raw in settings.items():
            if name not in names:
                raise ConfigError(f"{section}.{name}", f"unknown setting ({source})")
            updates[name] = _coerce(section, name, getattr(current, name), raw, source)
        config = replace(config, **{section: replace(current, **updates)})
    return config


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> CollectorConfig:
    """Build the configuration: defaults, then the TOML file, the environment, the flags.

    Args:
        path: TOML file, or None.
        environ: environment (``os.environ`` when None).
        overrides: ``{section: {field: value}}`` from command-line flags (None values are
            ignored).

    Raises:
        ConfigError: unreadable file, unknown section or setting, bad value.
    """
    config = CollectorConfig()
    if path is not None:
        try:
            doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError("config", f"cannot read {path} ({exc.__class__.__name__})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("config", f"{path} is not valid TOML: {exc}") from None
        config = _apply(config, doc, str(path))
    env = os.environ if environ is None else environ
    from_env: dict[str, dict[str, Any]] = {}
    for section in fields(config):
        for f in fields(getattr(config, section.name)):
            key = f"LOOPWATCH_{section.name.upper()}_{f.name.upper()}"
            if key in env:
                from_env.setdefault(section.name, {})[f.name] = env[key]
    for key, (section_name, name) in ENV_ALIASES.items():
        if key in env and name not in from_env.get(section_name, {}):
            from_env.setdefault(section_name, {})[name] = env[key]
    config = _apply(config, from_env, "environment")
    if overrides:
        cleaned = {
            s: {k: v for k, v in vals.items() if v is not None} for s, vals in overrides.items()
        }
        config = _apply(config, cleaned, "command line")
    return config.validate()
