"""Collector configuration: precedence, validation, secrets masked."""

from __future__ import annotations

from pathlib import Path

import pytest
from loopwatch.collector.config import load_config, parse_hostport
from loopwatch.collector.errors import ConfigError

from ...conftest import TESTDATA

BAD = TESTDATA / "collector"


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("bad_type.toml", "server.http"),
        ("unknown_setting.toml", "server.listen"),
        ("unknown_section.toml", "servers"),
        ("non_loopback.toml", "not loopback"),
        ("bad_fraction.toml", "sampling.completed_fraction"),
        ("not_toml.toml", "not valid TOML"),
    ],
)
def test_invalid_config_files(name: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(BAD / name, environ={})
    assert fragment in str(info.value)


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[store]\ndb = "file.duckdb"\nmax_rows = 10\n[server]\nhttp = "127.0.0.1:1000"\n')
    env = {"LOOPWATCH_STORE_DB": "env.duckdb", "LOOPWATCH_SERVER_HTTP": "127.0.0.1:2000"}
    cfg = load_config(
        f, environ=env, overrides={"store": {"db": "flag.duckdb"}, "server": {"http": None}}
    )
    assert cfg.store.db == "flag.duckdb"
    assert cfg.server.http == "127.0.0.1:2000"
    assert cfg.store.max_rows == 10
    assert cfg.server.otlp_http == "127.0.0.1:4318"


def test_env_values_are_typed() -> None:
    with pytest.raises(ConfigError, match=r"sampling\.completed_fraction"):
        load_config(environ={"LOOPWATCH_SAMPLING_COMPLETED_FRACTION": "lots"})
    cfg = load_config(
        environ={
            "LOOPWATCH_SERVER_ALLOW_NON_LOOPBACK": "true",
            "LOOPWATCH_SERVER_OTLP_HTTP": "0.0.0.0:1",
        }
    )
    assert cfg.server.allow_non_loopback is True


def test_otlp_grpc_is_off_by_default_and_loopback_only() -> None:
    assert load_config(environ={}).server.otlp_grpc == ""
    env = {"LOOPWATCH_SERVER_OTLP_GRPC": "127.0.0.1:4317"}
    assert load_config(environ=env).server.otlp_grpc == "127.0.0.1:4317"
    for bad, fragment in (
        ("0.0.0.0:4317", "not loopback"),
        ("nonsense", "HOST:PORT"),
        ("127.0.0.1:4318", "already used by server.otlp_http"),
    ):
        with pytest.raises(ConfigError, match=r"server\.otlp_grpc") as info:
            load_config(environ={"LOOPWATCH_SERVER_OTLP_GRPC": bad})
        assert fragment in str(info.value)


@pytest.mark.parametrize("days", ["-1", "nan", "inf", "36501", "forever", "true"])
def test_retention_days_must_be_a_number_of_days(days: str) -> None:
    with pytest.raises(ConfigError, match=r"store\.retention_days"):
        load_config(environ={"LOOPWATCH_STORE_RETENTION_DAYS": days})


def test_retention_days_from_file_env_and_flag(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[store]\nretention_days = 30\n")
    assert load_config(f, environ={}).store.retention_days == 30
    env = {"LOOPWATCH_STORE_RETENTION_DAYS": "7.5"}
    assert load_config(f, environ=env).store.retention_days == 7.5
    flag = {"store": {"retention_days": "0"}}
    assert load_config(f, environ=env, overrides=flag).store.retention_days == 0
    assert load_config(environ={}).store.retention_days == 0  # off by default


def test_secrets_are_masked_and_read(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cr3t-token\n")
    cfg = load_config(environ={}, overrides={"server": {"token_file": str(token)}})
    assert cfg.token() == "s3cr3t-token"
    assert (
        "s3cr3t" not in repr(cfg.describe())
        and cfg.describe()["server"]["token_file"] == "**********"
    )
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_config(environ={}, overrides={"server": {"token_file": str(empty)}}).token()


def test_missing_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(environ={}, overrides={"redaction": {"canaries_file": str(tmp_path / "nope")}})
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml", environ={})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:4318", ("127.0.0.1", 4318)),
        ("[::1]:9", ("::1", 9)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_parse_hostport(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text, what="x") == expected


@pytest.mark.parametrize("text", ["nonsense", ":80", "host:99999", "host:abc"])
def test_parse_hostport_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_hostport(text, what="server.http")


@pytest.mark.parametrize("cap", ["0", "-1", "1.5", "true"])
def test_hourly_cap_below_one_is_a_config_error(cap: str) -> None:
    """A cap of 0 passed validation, then the sampler refused it at start: a traceback
    and exit 1 instead of one line and exit 2."""
    with pytest.raises(ConfigError, match=r"sampling\.max_runs_per_reason_tool_per_hour"):
        load_config(environ={"LOOPWATCH_SAMPLING_MAX_RUNS_PER_REASON_TOOL_PER_HOUR": cap})


def test_the_edges_config_accepts_start_a_collector(tmp_path: Path) -> None:
    """Whatever the config accepts, the stages accept: the smallest and largest values of
    the bounded settings start a collector."""
    from loopwatch.collector.service import Collector

    edges = [
        {
            "LOOPWATCH_SAMPLING_MAX_RUNS_PER_REASON_TOOL_PER_HOUR": "1",
            "LOOPWATCH_SAMPLING_COMPLETED_FRACTION": "0",
            "LOOPWATCH_SAMPLING_STOP_TIMEOUT_SECONDS": "0.001",
            "LOOPWATCH_METRICS_TOP_N_AGENTS": "1",
            "LOOPWATCH_METRICS_TOP_N_TOOLS": "1",
            "LOOPWATCH_STORE_RETENTION_DAYS": "0",
        },
        {"LOOPWATCH_SAMPLING_COMPLETED_FRACTION": "1", "LOOPWATCH_STORE_RETENTION_DAYS": "36500"},
    ]
    for i, env in enumerate(edges):
        config = load_config(environ={"LOOPWATCH_STORE_DB": str(tmp_path / f"{i}.duckdb"), **env})
        Collector(config).close()
