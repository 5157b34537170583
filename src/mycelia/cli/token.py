"""``mycelia token``: make an issuer key, issue tokens, inspect them.

- ``keygen`` writes a new Ed25519 secret key (PEM, mode 0600, never overwriting) and
  prints its public key (PEM) for servers that verify tokens issued elsewhere.
- ``public-key`` prints the public key of a secret key file.
- ``issue`` prints one token (URL-safe base64 text) with per-collection grants.
- ``inspect`` prints what a token claims and, given a key, whether it is valid; it exits
  1 for a token that is invalid or expired, 0 otherwise.

Grants are words: ``read:COLLECTION``, ``write:COLLECTION`` (``*`` is every collection)
and ``metrics`` (may scrape ``GET /metrics`` when the server wants a token for it).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import Final

from mycelia.cli.settings import env_option, parse_duration
from mycelia.errors import ConfigError, DecodeError, PolicyDenied
from mycelia.node.tokens import (
    METRICS_SCOPE,
    Grant,
    TokenAgent,
    TokenIssuer,
    decode_token,
    encode_token,
    load_public_key,
    parse_token,
)
from mycelia.proto.codec import expect_name

__all__ = ["add_token_command", "parse_grants"]

VERBS: Final = ("read", "write")


def parse_grants(words: list[str]) -> dict[str, tuple[bool, bool]]:
    """``read:C`` / ``write:C`` / ``metrics`` words as collection → (read, write)."""
    rules: dict[str, tuple[bool, bool]] = {}
    for word in words:
        if word == "metrics":
            verb, collection = "read", METRICS_SCOPE
        else:
            verb, _, collection = word.partition(":")
            if verb not in VERBS or not collection:
                raise ConfigError(
                    f"--grant {word!r}: write read:COLLECTION, write:COLLECTION or metrics"
                )
            if collection != "*":
                try:
                    expect_name(collection, "collection")
                except DecodeError as exc:
                    raise ConfigError(f"--grant {word!r}: {exc}") from exc
        read, write = rules.get(collection, (False, False))
        rules[collection] = (read or verb == "read", write or verb == "write")
    return rules


def add_token_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``mycelia token keygen | public-key | issue | inspect``."""
    cmd = sub.add_parser(
        "token",
        help="make issuer keys, issue and inspect access tokens",
        description="Tokens let 'mycelia serve --auth tokens' decide, per collection, who "
        "reads and who writes. A token is signed with an Ed25519 secret key; servers "
        "verify it with that key (--token-secret-file) or its public key "
        "(--token-public-key-file).",
    )
    actions = cmd.add_subparsers(dest="action", required=True, metavar="ACTION")
    keygen = actions.add_parser(
        "keygen",
        help="write a new secret key file and print its public key",
        description="Write a new Ed25519 secret key to FILE (PEM, readable by its owner "
        "only; an existing file is never overwritten) and print its public key (PEM).",
    )
    _secret_file(keygen)
    keygen.set_defaults(run=keygen_command)
    public = actions.add_parser("public-key", help="print the public key of a secret key file")
    _secret_file(public)
    public.set_defaults(run=public_key_command)
    _issue_parser(actions)
    _inspect_parser(actions)


def _secret_file(cmd: argparse.ArgumentParser) -> None:
    env_option(
        cmd, "--secret-file", env="MYCELIA_TOKEN_SECRET_FILE", default=None, metavar="FILE",
        help="the issuer's Ed25519 secret key (PEM)",
    )  # fmt: skip


def _issue_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    issue = actions.add_parser(
        "issue",
        help="print a new token",
        description="Print a token signed with the secret key, granting what each --grant "
        "says until it expires. Example: mycelia token issue --secret-file issuer.pem "
        "--grant read:albums --grant write:albums --expires 1h",
    )
    _secret_file(issue)
    issue.add_argument(
        "--grant",
        action="append",
        default=[],
        metavar="GRANT",
        help="read:COLLECTION, write:COLLECTION ('*' is every collection) or metrics; "
        "repeat for more (at least one)",
    )
    issue.add_argument(
        "--subject", default="anonymous", help="who the token is for, as logs show it"
    )
    issue.add_argument(
        "--expires",
        default="24h",
        help="how long it is valid: e.g. 90s, 15m, 1h30m, 7d (default: 24h)",
    )
    issue.set_defaults(run=issue_command)


def _inspect_parser(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    inspect = actions.add_parser(
        "inspect",
        help="print what a token grants and whether it is valid",
        description="Print a token's subject, expiry and grants. With --secret-file or "
        "--public-key-file it also checks the signature; it exits 1 if the token is "
        "invalid or expired.",
    )
    inspect.add_argument("token", help="the token text ('-': read it from stdin)")
    _secret_file(inspect)
    env_option(
        inspect, "--public-key-file", env="MYCELIA_TOKEN_PUBLIC_KEY_FILE", default=None,
        metavar="FILE", help="check the signature with this public key (PEM) instead",
    )  # fmt: skip
    inspect.set_defaults(run=inspect_command)


def _issuer(args: argparse.Namespace) -> TokenIssuer:
    if args.secret_file is None:
        raise ConfigError("give --secret-file FILE (or MYCELIA_TOKEN_SECRET_FILE)")
    return TokenIssuer.from_secret_file(args.secret_file)


async def keygen_command(args: argparse.Namespace) -> int:
    """``mycelia token keygen``."""
    if args.secret_file is None:
        raise ConfigError("give --secret-file FILE: where to write the new key")
    issuer = TokenIssuer()
    issuer.write_secret_file(args.secret_file)
    print(issuer.public_key_pem(), end="")
    print(f"wrote the secret key to {args.secret_file}; keep it secret", file=sys.stderr)
    return 0


async def public_key_command(args: argparse.Namespace) -> int:
    """``mycelia token public-key``."""
    print(_issuer(args).public_key_pem(), end="")
    return 0


async def issue_command(args: argparse.Namespace) -> int:
    """``mycelia token issue``."""
    issuer = _issuer(args)
    if not args.grant:
        raise ConfigError("give at least one --grant (read:COLLECTION, write:COLLECTION)")
    rules = parse_grants(args.grant)
    expires = int(time.time()) + parse_duration(args.expires)
    print(encode_token(issuer.issue(args.subject, rules, expires=expires)))
    return 0


async def inspect_command(args: argparse.Namespace) -> int:
    """``mycelia token inspect``."""
    text = sys.stdin.read() if args.token == "-" else args.token  # noqa: S105 - stdin marker
    try:
        token = decode_token(text)
        grant, _, _ = parse_token(token)
    except DecodeError as exc:
        raise ConfigError(f"that is not a Mycelia token: {exc}") from exc
    _print_grant(grant)
    if args.secret_file is not None:
        key, source = TokenIssuer.from_secret_file(args.secret_file).public_key, args.secret_file
    elif args.public_key_file is not None:
        key, source = load_public_key(args.public_key_file), args.public_key_file
    else:
        print("signature not checked (give --secret-file or --public-key-file)")
        return 1 if grant.expires <= time.time() else 0
    try:
        TokenAgent(key).verify(token)
    except PolicyDenied as exc:
        print(f"INVALID   {exc}")
        return 1
    print(f"valid     signature checked against {source}")
    return 0


def _print_grant(grant: Grant) -> None:
    try:
        when = datetime.fromtimestamp(grant.expires, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):  # a claim, not yet checked: any int
        when = f"{grant.expires} seconds after 1970"
    left = grant.expires - time.time()
    state = f"in {_span(left)}" if left > 0 else f"EXPIRED {_span(-left)} ago"
    print(f"subject   {grant.subject}")
    print(f"expires   {when} ({state})")
    print(f"grants    {' '.join(grant.describe()) or '(none)'}")


def _span(seconds: float) -> str:
    """``2d3h``, ``1h5m``, ``12m`` or ``40s``."""
    whole = int(seconds)
    days, hours, minutes = whole // 86400, whole % 86400 // 3600, whole % 3600 // 60
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m" if minutes else f"{whole}s"
