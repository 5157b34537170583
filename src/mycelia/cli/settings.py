"""Options that come from a flag or, failing that, an environment variable.

:func:`env_option` adds a flag whose ``--help`` names its variable and its default; after
parsing, :func:`resolve` fills every option not given on the command line from the
environment, then from the default. Invariants:

- A flag always wins over its variable; the variable over the default.
- A bad value is a :class:`~mycelia.errors.ConfigError` naming where it came from (the
  flag or the variable), so the operator knows what to fix; ``mycelia`` exits 2 on it.
- Parsing is pure: the environment is passed in, never read from a global here.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from mycelia.errors import ConfigError

__all__ = [
    "Setting",
    "env_option",
    "parse_bool",
    "parse_choice",
    "parse_count",
    "parse_duration",
    "parse_port",
    "parse_seconds",
    "resolve",
]

ROOT: Final = "root_settings"
COMMAND: Final = "settings"


@dataclass(frozen=True, slots=True)
class Setting:
    """One option: where its value is kept, its variable, its default and its parser."""

    dest: str
    flag: str
    env: str
    default: object
    parse: Callable[[str], object]


def env_option(
    parser: argparse.ArgumentParser,
    *flags: str,
    env: str,
    default: object,
    help: str,
    parse: Callable[[str], object] = str,
    switch: bool = False,
    root: bool = False,
    metavar: str | None = None,
    nargs: str | None = None,
) -> None:
    """Add an option whose value falls back to ``$env`` then ``default``.

    ``switch``: a flag without a value (``--insecure-open``); its variable takes a
    boolean (:func:`parse_bool`). ``root``: an option of the top-level parser.
    """
    shown = "none" if default is None else ("off" if default is False else default)
    text = f"{help} (env {env}; default: {shown})"
    if switch:
        action = parser.add_argument(*flags, action="store_true", default=None, help=text)
        parse = parse_bool
    else:
        action = parser.add_argument(
            *flags, default=None, type=_flag_parser(parse), help=text, metavar=metavar,
            nargs=nargs,
        )  # fmt: skip
    key = ROOT if root else COMMAND
    found = parser.get_default(key) or ()
    setting = Setting(action.dest, flags[0], env, default, parse)
    parser.set_defaults(**{key: (*found, setting)})


def _flag_parser(parse: Callable[[str], object]) -> Callable[[str], object]:
    """``parse`` as an argparse type: a ConfigError becomes argparse's usage error."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return convert


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> argparse.Namespace:
    """Fill every option not given as a flag from ``environ``, then from its default."""
    for key in (ROOT, COMMAND):
        for setting in getattr(args, key, None) or ():
            if getattr(args, setting.dest, None) is not None:
                continue
            raw = environ.get(setting.env)
            if raw is None or raw == "":
                value = setting.default
            else:
                try:
                    value = setting.parse(raw)
                except ConfigError as exc:
                    raise ConfigError(f"{setting.env}={raw!r}: {exc}") from exc
            setattr(args, setting.dest, value)
    return args


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError("expected one of 1, true, yes, on, 0, false, no, off")


def parse_port(text: str) -> int:
    """A TCP port, 0 to 65535 (0 picks a free one)."""
    try:
        port = int(text)
    except ValueError:
        raise ConfigError("a port is a number from 0 to 65535") from None
    if not 0 <= port <= 65535:
        raise ConfigError("a port is a number from 0 to 65535")
    return port


def parse_seconds(text: str) -> float:
    """A non-negative number of seconds."""
    try:
        seconds = float(text)
    except ValueError:
        raise ConfigError("expected a number of seconds") from None
    if not seconds >= 0:
        raise ConfigError("expected a number of seconds, 0 or more")
    return seconds


DURATION: Final = re.compile(r"(\d+)([smhd])")
UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_count(text: str) -> int:
    """A whole number, 1 or more."""
    try:
        count = int(text)
    except ValueError:
        raise ConfigError("expected a whole number, 1 or more") from None
    if count < 1:
        raise ConfigError("expected a whole number, 1 or more")
    return count


def parse_duration(text: str) -> int:
    """Seconds in a duration such as ``90s``, ``15m``, ``1h30m`` or ``7d``."""
    compact = text.strip().lower()
    parts = DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ConfigError(f"{text!r} is not a duration: write e.g. 90s, 15m, 1h30m or 7d")
    seconds = sum(int(n) * UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ConfigError("a duration must be longer than 0 seconds")
    return seconds


def parse_choice(*options: str) -> Callable[[str], str]:
    """A parser accepting exactly one of ``options``."""

    def parse(text: str) -> str:
        if text not in options:
            raise ConfigError(f"expected one of {', '.join(options)}")
        return text

    return parse
