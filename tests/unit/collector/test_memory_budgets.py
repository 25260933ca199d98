"""The memory budgets of ``[store]``: validated, read from file and environment, and
applied to the real DuckDB connection and dedup window (docs/collector.md, "Memory")."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from loopwatch.collector.config import load_config
from loopwatch.collector.errors import ConfigError
from loopwatch.collector.store.keys import DEDUP_BYTES_PER_KEY
from loopwatch.collector.store.writer import Store, StoreConfig, memory_settings


def test_defaults_fit_the_sidecar_budget() -> None:
    """Proves the defaults (DuckDB 64 MiB, checkpoint at a 16 MiB log, window 16 MiB, one
    thread), and that the writer's own defaults are the same figures. 48 MiB with a
    64 MiB log made small reads of the API fail with DuckDB's out-of-memory error while
    the writer held its uncheckpointed rows; the smaller log holds fewer."""
    store = load_config(environ={}).store
    assert (
        store.memory_limit_mib,
        store.checkpoint_wal_mib,
        store.duckdb_threads,
        store.dedup_window_mib,
    ) == (64, 16, 1, 16)
    settings = memory_settings(store)
    assert settings == {
        "memory_limit_bytes": 64 << 20,
        "checkpoint_wal_bytes": 16 << 20,
        "duckdb_threads": 1,
        "dedup_max_keys": (16 << 20) // DEDUP_BYTES_PER_KEY,
    }
    writer = StoreConfig()
    assert writer.memory_limit_bytes == settings["memory_limit_bytes"]
    assert writer.checkpoint_wal_bytes == settings["checkpoint_wal_bytes"]
    assert writer.dedup_max_keys == settings["dedup_max_keys"]


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"LOOPWATCH_STORE_MEMORY_LIMIT_MIB": "16"}, "store.memory_limit_mib"),
        ({"LOOPWATCH_STORE_MEMORY_LIMIT_MIB": "lots"}, "store.memory_limit_mib"),
        ({"LOOPWATCH_STORE_DUCKDB_THREADS": "0"}, "store.duckdb_threads"),
        ({"LOOPWATCH_STORE_DEDUP_WINDOW_MIB": "0"}, "store.dedup_window_mib"),
        ({"LOOPWATCH_STORE_DEDUP_WINDOW_MIB": "1.5"}, "store.dedup_window_mib"),
        ({"LOOPWATCH_STORE_CHECKPOINT_WAL_MIB": "0"}, "store.checkpoint_wal_mib"),
        ({"LOOPWATCH_STORE_CHECKPOINT_WAL_MIB": "big"}, "store.checkpoint_wal_mib"),
        ({"LOOPWATCH_STORE_ROW_GROUP_ROWS": "1000"}, "store.row_group_rows"),
        ({"LOOPWATCH_STORE_ROW_GROUP_ROWS": "245760"}, "store.row_group_rows"),
        ({"LOOPWATCH_STORE_ROW_GROUP_ROWS": "-2048"}, "store.row_group_rows"),
    ],
)
def test_bad_budgets_fail_fast_naming_the_setting(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(environ=env)


def test_file_and_environment_set_the_budgets(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[store]\nmemory_limit_mib = 256\ndedup_window_mib = 8\ncheckpoint_wal_mib = 32\n",
        encoding="utf-8",
    )
    cfg = load_config(
        path,
        environ={"LOOPWATCH_STORE_DUCKDB_THREADS": "2", "LOOPWATCH_STORE_CHECKPOINT_WAL_MIB": "8"},
    )
    assert (cfg.store.memory_limit_mib, cfg.store.dedup_window_mib) == (256, 8)
    assert cfg.store.duckdb_threads == 2
    assert cfg.store.checkpoint_wal_mib == 8  # the environment wins over the file
    assert memory_settings(cfg.store)["checkpoint_wal_bytes"] == 8 << 20


def test_the_row_group_size_is_chosen_by_duckdb_version_unless_set(tmp_path: Path) -> None:
    """0 (the default) leaves the writer's choice by DuckDB version; a size set in the
    file reaches the writer (16,384 stalls less, but DuckDB 1.5.5 leaks with it)."""
    assert "row_group_rows" not in memory_settings(load_config(environ={}).store)
    path = tmp_path / "c.toml"
    path.write_text("[store]\nrow_group_rows = 16384\n", encoding="utf-8")
    settings = memory_settings(load_config(path, environ={}).store)
    assert settings["row_group_rows"] == 16_384
    assert StoreConfig(**settings).row_group_rows == 16_384


def test_store_applies_the_budgets_to_duckdb(tmp_path: Path) -> None:
    """Proves the real connection runs with the configured limit and threads."""
    settings = memory_settings(
        load_config(
            environ={
                "LOOPWATCH_STORE_MEMORY_LIMIT_MIB": "80",
                "LOOPWATCH_STORE_DUCKDB_THREADS": "2",
            }
        ).store
    )
    with Store(tmp_path / "m.duckdb", config=StoreConfig(**settings)) as store:
        limit, threads = store._con.execute(
            "SELECT current_setting('memory_limit'), current_setting('threads')"
        ).fetchone()
    assert threads == 2
    # DuckDB prints the limit in its own units (80 MiB = 83.8 MB).
    assert limit in ("80.0 MiB", "83.8 MB"), limit


def test_duckdb_limit_grows_with_the_key_indexes(tmp_path: Path) -> None:
    """Proves the writer keeps DuckDB's limit at the budget plus twice its in-memory key
    indexes (a fixed limit failed a checkpoint with a FATAL error at a million runs), so
    the budget bounds the cache, never the indexes a growing file needs."""
    budget = 32 << 20
    with Store(tmp_path / "i.duckdb", config=StoreConfig(memory_limit_bytes=budget)) as store:
        con = store._con
        assert con.execute("SELECT current_setting('memory_limit')").fetchone() in (
            ("32.0 MiB",),
            ("33.5 MB",),
        )
        con.execute("CREATE TABLE keys_only (k UBIGINT PRIMARY KEY)")
        con.execute("INSERT INTO keys_only SELECT range::UBIGINT * 7919 FROM range(400000)")
        (index_bytes,) = con.execute(
            "SELECT sum(memory_usage_bytes) FROM duckdb_memory() WHERE tag = 'ART_INDEX'"
        ).fetchone()
        assert index_bytes > 4 << 20
        store.run_maintenance().result(timeout=30)
        (limit_bytes,) = con.execute(
            "SELECT value FROM duckdb_settings() WHERE name = 'memory_limit'"
        ).fetchone()
        assert store._memory_limit_bytes == budget + 2 * index_bytes
        assert limit_bytes != "32.0 MiB"


def test_allocator_tuning_takes_effect_in_a_fresh_process(tmp_path: Path) -> None:
    """Proves ``tune_allocators`` switches pyarrow to the system allocator (its bundled
    pool kept freed pages the heap trim cannot return) without importing it, so a later
    import (the lake shipper's) gets that pool, and that glibc accepts the fixed
    mmap threshold: an 8 MiB block allocated after a 24 MiB one was freed is its own
    mapping, so freeing it lowers the process's mapped memory at once. Unfixed, glibc
    raises its threshold to 24 MiB at that free and serves 8 MiB from the heap. (A block
    near the threshold is no test: glibc serves it from a free heap chunk of that size when
    one exists, and whether one does depends on the process's history; CI's did.) Run in
    a child process: the settings are process-wide."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import ctypes, ctypes.util, os, sys
        from loopwatch.collector.process_memory import tune_allocators, _LIBC

        os.environ.pop("ARROW_DEFAULT_MEMORY_POOL", None)
        tune_allocators(mmap_threshold_bytes=128 * 1024)
        assert "pyarrow" not in sys.modules, "tune_allocators imported pyarrow"
        import pyarrow as pa  # imported later, as the lake shipper does

        assert pa.default_memory_pool().backend_name == "system", pa.default_memory_pool()
        if _LIBC is not None and hasattr(_LIBC, "mallinfo2"):
            class Info(ctypes.Structure):
                _fields_ = [(n, ctypes.c_size_t) for n in (
                    "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                    "fsmblks", "uordblks", "fordblks", "keepcost")]
            _LIBC.mallinfo2.restype = Info
            _LIBC.malloc.restype = ctypes.c_void_p
            _LIBC.free.argtypes = [ctypes.c_void_p]
            # Free one large block first: unfixed, glibc would raise its threshold here.
            _LIBC.free(_LIBC.malloc(24 << 20))
            before = _LIBC.mallinfo2().hblkhd
            block = _LIBC.malloc(8 << 20)
            during = _LIBC.mallinfo2().hblkhd
            _LIBC.free(block)
            after = _LIBC.mallinfo2().hblkhd
            assert during - before >= 8 << 20, (before, during)
            assert after == before, (before, after)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_pandas_stays_unloaded_while_duckdb_binds_parameters(tmp_path: Path) -> None:
    """Proves ``keep_pandas_unloaded``: in a fresh process with numpy and pyarrow loaded,
    a real store opens, its migrations bind parameters, and reads with parameters
    answer, yet pandas is never imported (without the call DuckDB imports it on the first
    bound parameter), nor by pyarrow; ``import pandas`` itself says why it failed."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import sys
        from loopwatch.collector.process_memory import keep_pandas_unloaded
        from loopwatch.collector.store.writer import Store

        assert keep_pandas_unloaded() is True
        with Store({str(tmp_path / "p.duckdb")!r}) as store:
            row = store._con.execute("SELECT ?::VARCHAR || ?", ["run-", 7]).fetchone()
            assert row == ("run-7",), row
            # pyarrow asks whether a list is a pandas object: no import either.
            import pyarrow as pa

            assert pa.array([1, 2], pa.uint64()).to_pylist() == [1, 2]
        assert "pandas" not in sys.modules, "pandas was imported"
        assert keep_pandas_unloaded() is False  # once is enough
        try:
            import pandas
        except ImportError as exc:
            assert "keep_pandas_unloaded" in str(exc), exc
        else:
            raise AssertionError("pandas imported")
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_checkpoint_may_use_half_the_budget_more_then_the_limit_is_back(tmp_path: Path) -> None:
    """DuckDB invalidates the whole database when a checkpoint cannot allocate a block,
    and every later write fails; readers on other cursors (the read API, the lake
    shipper) share the pool, so the writer raises the limit by ``CHECKPOINT_HEADROOM``
    times the budget for the checkpoint's length only. The real connection is wrapped to
    read DuckDB's own setting at the moment the writer runs ``CHECKPOINT``."""
    from loopwatch.collector.store.writer import CHECKPOINT_HEADROOM

    from tests.unit.test_store import commit, full_run

    budget = 64 << 20
    # A small log (DuckDB's own automatic checkpoint, inside COMMIT, is set at 8 times it).
    config = StoreConfig(memory_limit_bytes=budget, checkpoint_wal_bytes=4096)
    with Store(tmp_path / "c.duckdb", config=config) as store:
        real = store._con
        seen: list[int] = []

        def limit_bytes() -> int:
            row = real.execute("SELECT current_setting('memory_limit')").fetchone()
            assert row is not None
            number, unit = str(row[0]).split()
            return int(float(number) * {"MiB": 1 << 20, "GiB": 1 << 30}[unit])

        class Watched:
            def __getattr__(self, name: str) -> object:
                return getattr(real, name)

            def execute(self, sql: str, *args: object) -> object:
                if sql == "CHECKPOINT":
                    seen.append(limit_bytes())
                return real.execute(sql, *args)

        store._con = Watched()  # type: ignore[assignment]
        try:
            deadline = time.monotonic() + 30
            runs = 0
            while not seen and time.monotonic() < deadline:
                commit(store, full_run(f"c{runs}", "repeated_action"))
                runs += 1
                time.sleep(0.05)
            store.run_maintenance().result(timeout=30)  # past the checkpoint's turn
        finally:
            store._con = real
        assert seen, "the writer did not checkpoint past a 4 KiB log"
        assert CHECKPOINT_HEADROOM == 0.5
        assert seen[0] == budget * 3 // 2
        assert limit_bytes() == budget
