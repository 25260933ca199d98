"""The writer's Arrow batches (``collector/store/arrow.py``): nanoarrow arrays that DuckDB
scans through their capsule, with the writer's coercion of values that do not fit, and
no pyarrow import on the way."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import duckdb
import pytest
from loopwatch.collector.store.arrow import (
    BOOL,
    FLOAT64,
    INT64,
    STRING,
    UINT64,
    ArrowColumns,
    column,
)


def _round_trip(values: list[Any], kind: Any, sql_type: str) -> list[Any]:
    con = duckdb.connect()
    try:
        con.execute(f"CREATE TABLE t (v {sql_type})")
        data = ArrowColumns(["v"], [column(values, kind)], len(values))
        con.from_arrow(data.__arrow_c_stream__()).insert_into("t")
        return [row[0] for row in con.execute("SELECT v FROM t").fetchall()]
    finally:
        con.close()


@pytest.mark.parametrize(
    ("values", "kind", "sql_type", "stored"),
    [
        # Well-typed values, nulls included, pass as they are.
        ([1, None, -(2**63), 2**63 - 1], INT64, "BIGINT", [1, None, -(2**63), 2**63 - 1]),
        ([0, 2**64 - 1, None], UINT64, "UBIGINT", [0, 2**64 - 1, None]),
        ([1.5, None, 2], FLOAT64, "DOUBLE", [1.5, None, 2.0]),
        ([True, None, False], BOOL, "BOOLEAN", [True, None, False]),
        (["a", None, "é\U0001f600"], STRING, "VARCHAR", ["a", None, "é\U0001f600"]),
        # Past the type's range: null, the rest of the column kept.
        ([2**63, 7], INT64, "BIGINT", [None, 7]),
        ([-(2**63) - 1, 7], INT64, "BIGINT", [None, 7]),
        ([-1, 2**64, 3], UINT64, "UBIGINT", [None, None, 3]),
        # Another type: a bool or a float is no integer, an int no bool.
        ([True, 1.5, "9", 4], INT64, "BIGINT", [None, None, None, 4]),
        ([1, "x", True], BOOL, "BOOLEAN", [None, None, True]),
        (["1.5", 3, True, None], FLOAT64, "DOUBLE", [None, 3.0, 1.0, None]),
        # Strings: any value becomes its str; lone surrogates are replaced, not fatal.
        ([3, b"x", "ok"], STRING, "VARCHAR", ["3", "b'x'", "ok"]),
        (["a\ud800b", "\udfff", "fine"], STRING, "VARCHAR", ["a?b", "?", "fine"]),
        ([], STRING, "VARCHAR", []),
    ],
)
def test_values_are_stored_or_coerced_as_the_writer_always_did(
    values: list[Any], kind: Any, sql_type: str, stored: list[Any]
) -> None:
    assert _round_trip(values, kind, sql_type) == stored


def test_columns_of_several_types_read_as_one_table_through_a_registered_capsule() -> None:
    con = duckdb.connect()
    try:
        data = ArrowColumns(
            ["k", "name", "n"],
            [column([2**63 + 1, 5], UINT64), column(["x", None], STRING), column([1, 2], INT64)],
            2,
        )
        assert data.num_rows == 2
        con.register("v", data.__arrow_c_stream__())
        rows = con.execute("SELECT k, name, n FROM v ORDER BY n").fetchall()
        assert rows == [(2**63 + 1, "x", 1), (5, None, 2)]
        # Each call exports a new stream: the same columns append twice.
        con.execute("CREATE TABLE t (k UBIGINT, name VARCHAR, n BIGINT)")
        for _ in range(2):
            con.from_arrow(data.__arrow_c_stream__()).insert_into("t")
        assert con.execute("SELECT count(*) FROM t").fetchone() == (4,)
    finally:
        con.close()


def test_names_and_arrays_must_match() -> None:
    with pytest.raises(ValueError, match="2 names for 1 arrays"):
        ArrowColumns(["a", "b"], [column([1], INT64)], 1)


def test_a_store_writes_reads_and_reopens_without_importing_pyarrow(tmp_path: Any) -> None:
    """DuckDB's client imports pyarrow when handed an object to scan (to ask whether it
    is a pyarrow table); the writer hands it capsules only. Run in a fresh process with
    pyarrow importable and pandas kept out as in the collector: after a commit, a canary flag (the registered-view path) and a
    reopen (the run-key filter loaded from the file), pyarrow is still not imported."""
    root = Path(__file__).resolve().parents[3]
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(root)!r})
        from loopwatch.collector.process_memory import keep_pandas_unloaded

        keep_pandas_unloaded()  # as the collector does: pandas would import pyarrow
        import duckdb
        from loopwatch.collector.store.writer import Store
        from tests.unit.test_store import full_run

        path = {str(tmp_path / "a.duckdb")!r}
        with Store(path) as store:
            mapped = full_run("run-1", "repeated_action")
            mapped.canary_run_ids = frozenset({{"run-1"}})
            store.submit(mapped).result(timeout=30)
            store.submit(full_run("run-2", None)).result(timeout=30)
        with Store(path) as store:  # reopening loads the run-key filter from the file
            assert store._stored_runs.added == 2, store._stored_runs.added
        assert "pyarrow" not in sys.modules, "pyarrow was imported"
        con = duckdb.connect(path, read_only=True)
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (2,)
        assert con.execute("SELECT run_id FROM canary_flags").fetchall() == [("run-1",)]
        assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 6
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
