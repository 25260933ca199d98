"""The lake's documented tables follow the local store's tables column for column."""

from __future__ import annotations

import duckdb
import pytest
from loopwatch.collector.lake.connect import LakeTarget, mask_catalog
from loopwatch.collector.lake.schema import LAKE_TABLES, lake_columns
from loopwatch.collector.store.schema import apply_migrations


@pytest.mark.parametrize("table", sorted(LAKE_TABLES))
def test_each_lake_table_carries_every_local_column_with_its_type(table: str) -> None:
    con = duckdb.connect()
    apply_migrations(con)
    local = [(row[0], row[1]) for row in con.execute(f"DESCRIBE {table}").fetchall()]
    lake = dict(lake_columns(table))
    missing = [(name, kind) for name, kind in local if lake.get(name) != kind]
    assert missing == [], f"lake.{table} lacks (or retypes) local columns: {missing}"
    assert list(lake)[-2:] == ["collector_id", "shipped_unix_nano"]
    assert "run_id" in lake


def test_a_catalog_password_never_reaches_a_log_line() -> None:
    target = LakeTarget("postgres:dbname=lake host=db password=hunter2 user=lw", "s3://b/p/")
    assert "hunter2" not in target.describe()
    assert mask_catalog("postgres:postgresql://lw:hunter2@db:5432/lake") == (
        "postgres:postgresql://lw:***@db:5432/lake"
    )
    with pytest.raises(ValueError, match="single quote"):
        LakeTarget("postgres:dbname='x'", "/d/")
