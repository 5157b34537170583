"""``mycelia token keygen | public-key | issue | inspect``, run as a real process."""

from __future__ import annotations

import stat
import time
from pathlib import Path

from mycelia.node.tokens import TokenAgent, TokenIssuer, decode_token, encode_token, load_public_key
from tests.deploy.servers import assert_operator_error, run_cli


def keygen(tmp_path: Path) -> Path:
    done = run_cli("token", "keygen", "--secret-file", str(tmp_path / "issuer.pem"))
    assert done.returncode == 0, done.stderr
    (tmp_path / "issuer.pub").write_text(done.stdout)
    return tmp_path / "issuer.pem"


def test_keygen_writes_a_private_key_file_and_prints_its_public_key(tmp_path: Path) -> None:
    secret = keygen(tmp_path)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    issuer = TokenIssuer.from_secret_file(secret)
    assert load_public_key(tmp_path / "issuer.pub") == issuer.public_key
    public = run_cli("token", "public-key", "--secret-file", str(secret))
    assert public.stdout == (tmp_path / "issuer.pub").read_text()
    again = run_cli("token", "keygen", "--secret-file", str(secret))
    assert_operator_error(again, "refusing to overwrite a key")
    assert TokenIssuer.from_secret_file(secret).public_key == issuer.public_key


def test_issue_prints_a_token_with_the_grants_asked_for(tmp_path: Path) -> None:
    secret = keygen(tmp_path)
    done = run_cli(
        "token", "issue", "--secret-file", str(secret), "--grant", "read:albums",
        "--grant", "write:albums", "--grant", "read:notes", "--subject", "ann", "--expires", "1h",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    agent = TokenAgent(TokenIssuer.from_secret_file(secret).public_key)
    grant = agent.verify(decode_token(done.stdout))
    assert grant.subject == "ann"
    assert dict(grant.collections) == {"albums": (True, True), "notes": (True, False)}
    assert 3590 < grant.expires - time.time() <= 3600


def test_the_secret_file_can_come_from_the_environment(tmp_path: Path) -> None:
    secret = keygen(tmp_path)
    done = run_cli(
        "token", "issue", "--grant", "read:albums", env={"MYCELIA_TOKEN_SECRET_FILE": str(secret)}
    )
    assert done.returncode == 0, done.stderr


def test_inspect_checks_the_signature_and_the_expiry(tmp_path: Path) -> None:
    secret = keygen(tmp_path)
    issuer = TokenIssuer.from_secret_file(secret)
    good = encode_token(
        issuer.issue("ann", {"albums": (True, False)}, expires=int(time.time()) + 600)
    )
    late = encode_token(
        issuer.issue("bob", {"albums": (True, False)}, expires=int(time.time()) - 60)
    )
    forged = encode_token(TokenIssuer().issue("eve", {"*": (True, True)}, expires=2**40))

    unchecked = run_cli("token", "inspect", good)
    assert unchecked.returncode == 0
    assert "subject   ann" in unchecked.stdout
    assert "grants    read:albums" in unchecked.stdout
    assert "signature not checked" in unchecked.stdout
    valid = run_cli("token", "inspect", good, "--public-key-file", str(tmp_path / "issuer.pub"))
    assert valid.returncode == 0
    assert "valid" in valid.stdout
    expired = run_cli("token", "inspect", late, "--secret-file", str(secret))
    assert expired.returncode == 1
    assert "EXPIRED" in expired.stdout
    wrong = run_cli("token", "inspect", forged, "--secret-file", str(secret))
    assert wrong.returncode == 1
    assert "INVALID   the token's signature does not verify" in wrong.stdout


def test_mistakes_in_token_commands_are_one_line_and_exit_2(tmp_path: Path) -> None:
    secret = keygen(tmp_path)
    assert_operator_error(
        run_cli("token", "issue", "--secret-file", str(secret)), "give at least one --grant"
    )
    assert_operator_error(
        run_cli("token", "issue", "--secret-file", str(tmp_path / "no.pem"), "--grant", "read:a"),
        "does not exist",
    )
    assert_operator_error(
        run_cli(
            "token", "issue", "--secret-file", str(secret), "--grant", "read:a", "--expires", "soon"
        ),
        "is not a duration",
    )
    assert_operator_error(run_cli("token", "inspect", "not-a-token"), "not a Mycelia token")
