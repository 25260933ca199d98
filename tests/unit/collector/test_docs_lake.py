"""docs/lake.md is the lake's contract: its tables list LAKE_TABLES column for column, and
its query example runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from loopwatch.collector.lake.connect import LakeTarget, connect_lake
from loopwatch.collector.lake.schema import LAKE_TABLES, ensure_lake_schema, lake_columns

DOC = Path(__file__).resolve().parents[3] / "docs" / "lake.md"


def documented_columns(table: str) -> list[tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"### `{table}`\n")
    end = text.find("\n#", start + 1)
    section = text[start : end if end != -1 else None]
    return re.findall(r"^\| `(\w+)` \| `([A-Z]+)` \| .+ \|$", section, re.M)


@pytest.mark.parametrize("table", sorted(LAKE_TABLES))
def test_each_documented_table_lists_the_lake_columns_in_order(table: str) -> None:
    assert documented_columns(table) == list(lake_columns(table))


def test_no_other_table_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert set(re.findall(r"^### `(\w+)`$", text, re.M)) == set(LAKE_TABLES)


def test_the_query_example_runs(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Query the lake with any DuckDB") :]
    found = re.search(r"```sql\n(.*?)```", section, re.S)
    assert found is not None
    statements = [s.strip() for s in found.group(1).split(";") if s.strip()]
    queries = [s for s in statements if not re.match(r"(--.*\n)*\s*(LOAD|ATTACH)\b", s)]
    assert len(queries) == 2, queries
    target = LakeTarget(str(tmp_path / "catalog.ducklake"), str(tmp_path / "data") + "/")
    con = connect_lake(target)
    try:
        ensure_lake_schema(con)
        con.execute(
            "INSERT INTO lake.runs (run_id, stop_reason, stop_unix_nano, collector_id) "
            "VALUES ('r1', 'repeated_action', epoch_ns(now()), 'c1')"
        )
        con.execute(
            "INSERT INTO lake.steps (run_id, step, kind, tool) "
            "VALUES ('r1', 1, 'tool_result', 'lookup_order')"
        )
        assert con.execute(queries[0]).fetchall() == [("c1", "repeated_action", 1)]
        assert con.execute(queries[1]).fetchall()[0][:3] == (1, "tool_result", "lookup_order")
    finally:
        con.close()
