"""Open a DuckDB connection with the lake attached, offline.

The lake is a DuckLake (https://ducklake.select): a catalog database, PostgreSQL in fleet
mode, that records tables, snapshots and which Parquet files hold which rows, and a data
path where those Parquet files live. Every collector and every reader attaches the same
catalog and data path.

The two DuckDB extensions it needs are loaded from files, never fetched:

1. ``duckdb-extension-ducklake`` and ``duckdb-extension-postgres-scanner`` (the extra
   ``loopwatch[lake]``) are DuckDB's official signed binaries repackaged on PyPI; their
   files are loaded by path. (The PyPI package named ``postgres`` fails to load: the
   scanner is the one.)
2. Without them, ``LOAD ducklake`` / ``LOAD postgres_scanner`` from DuckDB's extension
   directory (or ``extension_directory``), which holds them once someone ran
   ``INSTALL ducklake; INSTALL postgres`` where the network is there.

Autoinstall and autoload are off in both cases, so a missing extension is one clear
:class:`~loopwatch.collector.errors.LakeUnavailable`, not a download attempt.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ..errors import LakeUnavailable

if TYPE_CHECKING:
    import duckdb

    from ..config import CollectorConfig

__all__ = [
    "LakeTarget",
    "attach_lake",
    "connect_lake",
    "extension_files",
    "mask_catalog",
    "target_of",
]

ALIAS: Final = "lake"
"""The name the lake is attached under in every loopwatch connection."""

_EXTENSIONS: Final = (
    ("postgres_scanner", "duckdb_extension_postgres_scanner"),
    ("ducklake", "duckdb_extension_ducklake"),
)
_SIDECAR_ALLOCATOR_FLUSH: Final = "16MiB"
"""DuckDB's allocator flush thresholds on a collector's lake connections, as the store
sets them on its own (``collector/store/writer.py``, ``_ALLOCATOR_FLUSH_BYTES``)."""
_PASSWORD = re.compile(r"(password\s*=\s*)(\S+)", re.IGNORECASE)
_URI_PASSWORD = re.compile(r"(://[^:/@\s]+:)([^@\s]+)(@)")


def mask_catalog(catalog: str) -> str:
    """``catalog`` with any password replaced by ``***`` (key=value and URI forms)."""
    return _URI_PASSWORD.sub(r"\1***\3", _PASSWORD.sub(r"\1***", catalog))


@dataclass(frozen=True, slots=True)
class LakeTarget:
    """Where the lake is.

    Attributes:
        catalog: the DuckLake catalog, as DuckLake spells it after ``ducklake:``:
            ``postgres:dbname=lake host=127.0.0.1 port=5432 user=loopwatch`` in fleet mode
            (libpq key=value or a ``postgresql://`` URI after ``postgres:``), or a local
            ``path/to/catalog.ducklake`` file for a single machine.
        data_path: the folder (or ``s3://bucket/prefix/``) for the Parquet files. Must
            end up the same string for every collector and reader of one lake.
        extension_directory: where ``LOAD`` looks when the extension wheels are absent;
            None keeps DuckDB's default (``~/.duckdb/extensions``).
        memory_limit_mib: DuckDB ``memory_limit`` of the connections a collector opens
            to the lake (the shipper's, housekeeping's), in MiB: their buffer cache,
            the batch being shipped and the Parquet writer share it, and spill to
            ``temp_directory`` past it. None keeps DuckDB's default (80 % of the RAM).
        temp_directory: where those connections spill; None keeps DuckDB's default
            (``.tmp`` under the working directory, for an in-memory database).
    """

    catalog: str
    data_path: str
    extension_directory: str | None = None
    memory_limit_mib: int | None = None
    temp_directory: str | None = None

    def __post_init__(self) -> None:
        if not self.catalog.strip():
            raise ValueError("lake catalog is empty")
        if not self.data_path.strip():
            raise ValueError("lake data path is empty")
        if "'" in self.catalog or "'" in self.data_path:
            raise ValueError("lake catalog and data path may not contain a single quote")

    @property
    def is_postgres(self) -> bool:
        """Whether the catalog is a PostgreSQL database (fleet mode)."""
        return self.catalog.startswith("postgres:")

    @property
    def postgres_dsn(self) -> str:
        """The libpq connection string of a PostgreSQL catalog (for psycopg)."""
        if not self.is_postgres:
            raise ValueError("the lake catalog is not a PostgreSQL database")
        return self.catalog.removeprefix("postgres:")

    def describe(self) -> str:
        """One line for logs, with any password masked."""
        return f"ducklake:{mask_catalog(self.catalog)} data={self.data_path}"


def extension_files() -> dict[str, Path] | None:
    """The extension files shipped by the ``loopwatch[lake]`` wheels, or None.

    Returns:
        ``{"postgres_scanner": path, "ducklake": path}`` when both wheels are installed
        and each holds its ``.duckdb_extension`` file; None when either is missing.
    """
    found: dict[str, Path] = {}
    for name, module in _EXTENSIONS:
        try:
            package = importlib.import_module(module)
        except ImportError:
            return None
        root = Path(package.__file__ or "").parent / "extensions"
        files = sorted(root.glob(f"*/{name}.duckdb_extension"))
        if not files:
            return None
        found[name] = files[-1]
    return found


def _load_extensions(con: duckdb.DuckDBPyConnection) -> None:
    files = extension_files()
    try:
        if files is not None:
            for name, _ in _EXTENSIONS:
                con.execute(f"LOAD '{files[name]}'")
        else:
            for name, _ in _EXTENSIONS:
                con.execute(f"LOAD {name}")
    except Exception as exc:  # duckdb.IOException, duckdb.InvalidInputException
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise LakeUnavailable(
            "extension",
            "cannot load the DuckLake extensions: install the extra "
            f"(pip install 'loopwatch[lake]'), or run INSTALL ducklake; INSTALL postgres "
            f"once where the network is there ({first})",
        ) from exc


def attach_lake(
    con: duckdb.DuckDBPyConnection, target: LakeTarget, *, read_only: bool = False
) -> None:
    """Load the extensions into ``con`` and attach the lake as ``lake``.

    A new catalog is created on first attach (DuckLake does that itself).

    Raises:
        LakeUnavailable: an extension did not load (``what="extension"``), the catalog
            did not answer or was written by another DuckLake version (``catalog`` /
            ``version``). The message masks passwords.
    """
    _load_extensions(con)
    options = [f"DATA_PATH '{target.data_path}'"]
    if read_only:
        options.append("READ_ONLY")
    try:
        con.execute(f"ATTACH 'ducklake:{target.catalog}' AS {ALIAS} ({', '.join(options)})")
    except Exception as exc:  # duckdb.Error subclasses; the message names the cause
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        what = "version" if "version" in text.lower() else "catalog"
        raise LakeUnavailable(
            what, f"cannot attach the lake {target.describe()}: {mask_catalog(text)[:300]}"
        ) from exc


def connect_lake(
    target: LakeTarget,
    *,
    read_only: bool = False,
    memory_limit: str | None = None,
    threads: int | None = None,
) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection with the lake attached as ``lake``.

    Args:
        target: the catalog and data path (and the connection's memory limit and temp
            directory, when it names them).
        read_only: attach the lake read-only (readers).
        memory_limit: DuckDB ``memory_limit`` such as ``"256MB"``; None takes
            ``target.memory_limit_mib`` (with the store's allocator flush thresholds,
            16 MiB), else DuckDB's.
        threads: DuckDB ``threads``; None keeps DuckDB's.

    Raises:
        LakeUnavailable: see :func:`attach_lake`.
    """
    import duckdb

    config: dict[str, Any] = {
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
    }
    if target.extension_directory is not None:
        config["extension_directory"] = target.extension_directory
    if memory_limit is None and target.memory_limit_mib is not None:
        memory_limit = f"{int(target.memory_limit_mib)}MiB"
        # A sidecar's connection: freed memory goes back to the system as the store's
        # does (DuckDB keeps up to 128 MiB, 512 MiB after a bulk free, outside the limit).
        config["allocator_flush_threshold"] = _SIDECAR_ALLOCATOR_FLUSH
        config["allocator_bulk_deallocation_flush_threshold"] = _SIDECAR_ALLOCATOR_FLUSH
    if memory_limit is not None:
        config["memory_limit"] = memory_limit
    if target.temp_directory is not None:
        config["temp_directory"] = target.temp_directory
    if threads is not None:
        config["threads"] = threads
    con = duckdb.connect(":memory:", config=config)
    try:
        attach_lake(con, target, read_only=read_only)
    except BaseException:
        con.close()
        raise
    return con


def target_of(config: CollectorConfig) -> LakeTarget:
    """The lake a collector writes to, from its ``[lake]`` and ``[store]`` settings.

    Its connections take ``lake.memory_limit_mib`` and spill beside the local file
    (``<store.db>.lake.tmp``), as the store's own DuckDB spills to ``<store.db>.tmp``.

    Raises:
        ValueError: ``[lake]`` names no catalog or data path.
    """
    lake = config.lake
    return LakeTarget(
        lake.catalog,
        lake.data_path,
        lake.extension_directory or None,
        memory_limit_mib=lake.memory_limit_mib,
        temp_directory=f"{config.store.db}.lake.tmp",
    )
