"""The lake settings: flags, environment, file, durations and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from loopwatch.collector.config import load_config, parse_duration_seconds
from loopwatch.collector.errors import ConfigError

CATALOG = "postgres:dbname=lake host=127.0.0.1 port=5432 password=s3cr3t"


def test_lake_is_off_by_default() -> None:
    config = load_config(environ={})
    assert not config.lake.enabled
    assert config.lake.collector_id  # the host name


def test_flags_beat_env_beat_file(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(
        '[lake]\ncatalog = "file.ducklake"\ndata_path = "/data/file"\n'
        'local_retention_seconds = "12h"\n'
    )
    env = {"LOOPWATCH_LAKE": CATALOG, "LOOPWATCH_LAKE_DATA": "/data/env"}
    config = load_config(
        toml, environ=env, overrides={"lake": {"data_path": "/data/flag", "collector_id": "c7"}}
    )
    assert config.lake.catalog == CATALOG
    assert config.lake.data_path == "/data/flag"
    assert config.lake.collector_id == "c7"
    assert config.lake.local_retention_seconds == 12 * 3600
    described = repr(config.describe())
    assert "s3cr3t" not in described and "password=***" in described


def test_long_env_name_wins_over_short_one() -> None:
    env = {
        "LOOPWATCH_LAKE": "a.ducklake",
        "LOOPWATCH_LAKE_CATALOG": "b.ducklake",
        "LOOPWATCH_LAKE_DATA_PATH": "/d",
    }
    assert load_config(environ=env).lake.catalog == "b.ducklake"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("12h", 43_200.0), ("7d", 604_800.0),
     ("1.5h", 5_400.0), (" 2D ", 172_800.0)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration_seconds(text, what="x") == seconds


@pytest.mark.parametrize(
    ("lake", "where"),
    [
        ({"catalog": CATALOG}, "lake.data_path"),
        ({"data_path": "/d"}, "lake.catalog"),
        ({"catalog": CATALOG, "data_path": "/d", "local_retention_seconds": "7 weeks"},
         "lake.local_retention_seconds"),
        ({"catalog": CATALOG, "data_path": "/d", "local_retention_seconds": "-1"},
         "lake.local_retention_seconds"),
        ({"catalog": CATALOG, "data_path": "/d", "ship_interval_seconds": "0"},
         "lake.ship_interval_seconds"),
        ({"catalog": CATALOG, "data_path": "/d", "ship_batch_runs": "0"}, "lake.ship_batch_runs"),
        ({"catalog": CATALOG, "data_path": "/d", "collector_id": " "}, "lake.collector_id"),
        ({"catalog": CATALOG, "data_path": "/d", "memory_limit_mib": "32"},
         "lake.memory_limit_mib"),
        ({"catalog": CATALOG, "data_path": "/d", "memory_limit_mib": "lots"},
         "lake.memory_limit_mib"),
        ({"catalog": "x'y.ducklake", "data_path": "/d"}, "lake.catalog"),
    ],
)  # fmt: skip
def test_bad_lake_settings(lake: dict[str, str], where: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, overrides={"lake": lake})
    assert str(info.value).startswith(where)
    assert "s3cr3t" not in str(info.value)


def test_lake_connections_take_the_memory_limit_and_spill_beside_the_file(
    tmp_path: Path,
) -> None:
    """The shipper's and housekeeping's lake connections get ``lake.memory_limit_mib``
    (not DuckDB's 80 % of the machine) and spill to ``<store.db>.lake.tmp``."""
    from loopwatch.collector.lake.connect import connect_lake, target_of

    db = tmp_path / "local.duckdb"
    config = load_config(
        environ={
            "LOOPWATCH_LAKE": str(tmp_path / "catalog.ducklake"),
            "LOOPWATCH_LAKE_DATA": str(tmp_path / "data") + "/",
            "LOOPWATCH_LAKE_MEMORY_LIMIT_MIB": "96",
        },
        overrides={"store": {"db": str(db)}},
    )
    target = target_of(config)
    assert (target.memory_limit_mib, target.temp_directory) == (96, f"{db}.lake.tmp")
    con = connect_lake(target)
    try:
        limit, temp, flush = con.execute(
            "SELECT current_setting('memory_limit'), current_setting('temp_directory'), "
            "current_setting('allocator_flush_threshold')"
        ).fetchone() or (None, None, None)
    finally:
        con.close()
    assert limit == "96.0 MiB" and temp == f"{db}.lake.tmp" and flush == "16.0 MiB"
    assert load_config(environ={}).lake.memory_limit_mib == 64


def test_docs_list_every_lake_setting_flag_and_metric() -> None:
    from dataclasses import fields

    from loopwatch.cli._options import COLLECTOR_FLAGS
    from loopwatch.collector.config import LakeConfig
    from loopwatch.collector.metrics import LAKE_METRIC_NAMES

    docs = Path(__file__).resolve().parents[3] / "docs"
    collector_md = (docs / "collector.md").read_text(encoding="utf-8")
    lake_md = (docs / "lake.md").read_text(encoding="utf-8")
    shipping = lake_md.split("## Shipping", 1)[1].split("\n## ", 1)[0]
    for f in fields(LakeConfig):
        assert f"`lake.{f.name}`" in collector_md, f.name
    for flag, _param, section, _field, _metavar, _help in COLLECTOR_FLAGS:
        if section == "lake":
            assert f"`{flag}" in collector_md and flag in shipping, flag
    for name in LAKE_METRIC_NAMES:
        assert f"`{name}`" in collector_md, name
