"""A stateless ``mycelia serve --postgres``: its node key from a file, the environment or
the database (per node name), and replicas that start together agree on one system."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mycelia.node.tokens import TokenIssuer
from tests.cluster.processes import cluster_database
from tests.deploy.servers import Served, assert_operator_error, run_cli, start_serve

pytestmark = pytest.mark.postgres

READY = r"serving \S+: node (\S+), system (\S+),"


@pytest.fixture
def database(pg_dsn: str) -> Iterator[str]:
    with cluster_database(pg_dsn) as dsn:
        yield dsn


def serve(tmp: Path, name: str, *flags: str, env: dict[str, str] | None = None) -> Served:
    where = tmp / name
    where.mkdir(exist_ok=True)
    return start_serve(where, *flags, env=env)


def identity(served: Served) -> tuple[str, str]:
    """(node id, system root) from the server's readiness line."""
    found = served.err.wait_for(READY)
    return found.group(1), found.group(2)


def public_id(issuer: TokenIssuer) -> str:
    return base64.urlsafe_b64encode(issuer.public_key).decode().rstrip("=")


def test_the_node_key_comes_from_a_key_file_or_the_environment(
    database: str, tmp_path: Path
) -> None:
    issuer = TokenIssuer()
    issuer.write_secret_file(tmp_path / "node.pem")
    from_file = serve(
        tmp_path, "a", "--postgres", database, "--key-file", str(tmp_path / "node.pem")
    )
    pem = (tmp_path / "node.pem").read_text()
    from_env = serve(tmp_path, "b", "--postgres", database, env={"MYCELIA_NODE_KEY": pem})
    try:
        assert identity(from_file)[0] == identity(from_env)[0] == public_id(issuer)
        assert identity(from_file)[1] == identity(from_env)[1], "one system"
    finally:
        from_file.stop()
        from_env.stop()


def test_a_node_name_keeps_one_key_in_the_database_and_replicas_agree_on_one_system(
    database: str, tmp_path: Path
) -> None:
    names = ["web-1", "web-2", "web-1", "web-3"]
    with ThreadPoolExecutor(len(names)) as pool:  # all at once, on an empty database
        futures = [
            pool.submit(serve, tmp_path, f"s{i}", "--postgres", database, "--node-name", name)
            for i, name in enumerate(names)
        ]
        servers = [f.result() for f in futures]
    try:
        seen = [identity(s) for s in servers]
        assert len({root for _, root in seen}) == 1, "replicas made one system"
        assert seen[0][0] == seen[2][0], "one name, one key"
        assert len({node for node, _ in seen}) == 3
    finally:
        for served in servers:
            served.stop()
    again = serve(tmp_path, "again", "--postgres", database, "--node-name", "web-2")
    try:
        assert identity(again) == seen[1], "the key outlives the process"
    finally:
        again.stop()


def test_key_mistakes_are_one_line_and_exit_2(database: str, tmp_path: Path) -> None:
    (tmp_path / "bad.pem").write_text("not a key\n")
    cases = [
        (["--postgres", database, "--key-file", str(tmp_path / "missing.pem")], "does not exist"),
        (
            ["--postgres", database, "--key-file", str(tmp_path / "bad.pem")],
            "not an unencrypted PEM",
        ),
        (["--data", str(tmp_path / "d"), "--node-name", "x"], "needs --postgres"),
        (["--postgres", database, "--node-name", "x", "--node-key", "AAAA"], "one node key source"),
        (["--postgres", database, "--node-key", "AAAA"], "not an Ed25519 secret key"),
    ]
    for flags, says in cases:
        assert_operator_error(run_cli("serve", "--port", "0", *flags), says)
    assert not (tmp_path / "d").exists()
