"""Settings: a flag wins over its environment variable, which wins over the default."""

from __future__ import annotations

import argparse
import re

import pytest

from mycelia.cli.main import build_parser
from mycelia.cli.settings import parse_bool, parse_duration, resolve
from mycelia.cli.token import parse_grants
from mycelia.errors import ConfigError


def serve_args(*argv: str, env: dict[str, str] | None = None) -> argparse.Namespace:
    return resolve(build_parser().parse_args(["serve", *argv]), env or {})


def test_a_flag_wins_over_its_environment_variable() -> None:
    args = serve_args(
        "--port", "1234", "--host", "::1", env={"MYCELIA_PORT": "9", "MYCELIA_HOST": "x"}
    )
    assert (args.port, args.host) == (1234, "::1")


def test_the_environment_fills_what_no_flag_gives() -> None:
    env = {
        "MYCELIA_DATA": "/srv/mycelia",
        "MYCELIA_HOST": "0.0.0.0",
        "MYCELIA_PORT": "80",
        "MYCELIA_POSTGRES": "postgresql://db/mycelia",
        "MYCELIA_TOKEN_SECRET_FILE": "/run/secrets/issuer.pem",
        "MYCELIA_AUTH": "tokens",
        "MYCELIA_INSECURE_OPEN": "yes",
        "MYCELIA_METRICS": "token",
        "MYCELIA_SHUTDOWN_GRACE": "2.5",
    }
    args = serve_args(env=env)
    assert args.data == "/srv/mycelia"
    assert (args.host, args.port, args.auth, args.metrics) == ("0.0.0.0", 80, "tokens", "token")
    assert args.postgres == "postgresql://db/mycelia"
    assert args.token_secret_file == "/run/secrets/issuer.pem"
    assert args.insecure_open is True
    assert args.shutdown_grace == 2.5


def test_defaults_apply_without_flag_or_variable() -> None:
    args = serve_args()
    assert (args.data, args.host, args.port, args.auth) == (
        "./mycelia-data",
        "127.0.0.1",
        9797,
        "open",
    )
    assert (args.insecure_open, args.deflate, args.health, args.metrics) == (
        False,
        False,
        "on",
        "on",
    )
    assert (args.log_level, args.log_format) == ("INFO", "text")


def test_log_flags_work_before_and_after_the_command() -> None:
    before = resolve(build_parser().parse_args(["--log-format", "json", "serve"]), {})
    after = resolve(
        build_parser().parse_args(["serve", "--log-level", "DEBUG"]), {"MYCELIA_LOG_FORMAT": "json"}
    )
    assert (before.log_format, before.log_level) == ("json", "INFO")
    assert (after.log_format, after.log_level) == ("json", "DEBUG")


def test_a_bad_variable_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="MYCELIA_AUTH='token': expected one of open, tokens"):
        serve_args(env={"MYCELIA_AUTH": "token"})
    with pytest.raises(ConfigError, match="MYCELIA_DEFLATE='maybe'"):
        serve_args(env={"MYCELIA_DEFLATE": "maybe"})


def test_serve_help_names_every_flag_s_variable_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    flags = re.findall(r" (--[a-z-]+)", text.split("options:", 1)[1])
    variables = re.findall(r"\(env (MYCELIA_[A-Z_]+); default: [^)]+\)", text)
    expected = {f for f in flags if f != "--help"}
    assert len(variables) == len(expected), (variables, expected)
    for flag in expected:
        assert f"MYCELIA_{flag[2:].upper().replace('-', '_')}" in variables, flag


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("15m", 900), ("1h30m", 5400), ("7d", 604800)]
)
def test_durations_read_as_an_operator_writes_them(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1", "1x", "h1", "0s", "1h 30m"])
def test_a_bad_duration_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


def test_grants_are_per_collection_read_and_write() -> None:
    assert parse_grants(["read:albums", "write:albums", "read:notes", "write:*", "metrics"]) == {
        "albums": (True, True),
        "notes": (True, False),
        "*": (False, True),
        "_mycelia_metrics": (True, False),
    }
    for bad in ("albums", "admin:albums", "read:", "read:bad name"):
        with pytest.raises(ConfigError, match="--grant"):
            parse_grants([bad])


def test_booleans_read_the_usual_spellings() -> None:
    assert [parse_bool(t) for t in ("1", "TRUE", "yes", "On", "0", "false", "no", "off")] == [
        True
    ] * 4 + [False] * 4


def test_connection_limits_come_from_flags_or_the_environment() -> None:
    assert (serve_args().max_connections, serve_args().max_connections_per_ip) == (1024, None)
    args = serve_args("--max-connections", "50", env={"MYCELIA_MAX_CONNECTIONS_PER_IP": "4"})
    assert (args.max_connections, args.max_connections_per_ip) == (50, 4)
    with pytest.raises(ConfigError, match="MYCELIA_MAX_CONNECTIONS='0': expected a whole"):
        serve_args(env={"MYCELIA_MAX_CONNECTIONS": "0"})
