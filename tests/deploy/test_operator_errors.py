"""Operator mistakes: one line on stderr, exit code 2, and nothing left behind on disk."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from mycelia import __version__
from tests.deploy.conftest import client
from tests.deploy.servers import assert_operator_error, run_cli, start_serve


def tree(root: Path) -> set[str]:
    """Every path below ``root`` (what a command may have left behind)."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def read_only(directory: Path) -> tuple[str, ...]:
    """A prefix that runs a command with ``directory`` read-only for it.

    Not root: the directory's permissions. Root ignores those, so the command runs in a
    private mount namespace where the directory is bind-mounted read-only (gone with it).
    """
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return ()
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to make a directory read-only for root")
    prefix = ("unshare", "-m", "sh", "-c", 'mount -o bind,ro "$1" "$1" && shift && exec "$@"',
              "sh", str(directory))  # fmt: skip
    probe = subprocess.run([*prefix, "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"needs permission to bind-mount read-only: {probe.stderr.decode()}")
    return prefix


def test_a_port_in_use_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = run_cli("serve", "--port", str(port), "--data", str(tmp_path / "data"))
    assert_operator_error(done, f"127.0.0.1:{port} is in use")
    assert tree(tmp_path) == set()


def test_data_pointing_at_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    done = run_cli("serve", "--port", "0", "--data", str(tmp_path / "notes.txt"))
    assert_operator_error(done, "is a file, not a directory")
    assert tree(tmp_path) == {"notes.txt"}
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_read_only_data_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ro").mkdir()
    prefix = read_only(tmp_path / "ro")
    for data, says in ((tmp_path / "ro", "cannot open the store"),
                       (tmp_path / "ro" / "new", "cannot create --data")):  # fmt: skip
        done = run_cli("serve", "--port", "0", "--data", str(data), prefix=prefix)
        assert_operator_error(done, says)
        assert "this user can write" in done.stderr
    (tmp_path / "ro").chmod(0o755)
    assert tree(tmp_path) == {"ro"}


def test_a_missing_dump_file_is_refused_before_the_store_is_created(tmp_path: Path) -> None:
    done = run_cli("load", str(tmp_path / "missing.dump"), str(tmp_path / "store"))
    assert_operator_error(done, "missing.dump does not exist")
    assert tree(tmp_path) == set()


def test_inspect_and_dump_never_create_a_store(tmp_path: Path) -> None:
    for command in ("inspect", "dump"):
        done = run_cli(command, str(tmp_path / "typo"))
        assert_operator_error(done, "there is no store in")
    assert tree(tmp_path) == set()


def test_a_bad_environment_value_names_its_variable(tmp_path: Path) -> None:
    done = run_cli("serve", "--data", str(tmp_path / "d"), env={"MYCELIA_PORT": "http"})
    assert_operator_error(done, "MYCELIA_PORT='http': a port is a number")
    assert tree(tmp_path) == set()


def test_a_public_address_without_authentication_refuses_to_start(tmp_path: Path) -> None:
    done = run_cli("serve", "--host", "0.0.0.0", "--port", "0", "--data", str(tmp_path / "d"))
    assert_operator_error(done, "refusing to serve 0.0.0.0 without authentication")
    assert "--auth tokens" in done.stderr
    assert tree(tmp_path) == set()


async def test_insecure_open_lets_a_public_address_start(tmp_path: Path) -> None:
    served = start_serve(tmp_path, "--host", "0.0.0.0", "--insecure-open")
    try:
        assert served.url.startswith("ws://0.0.0.0:")
        async with client(served.url.replace("0.0.0.0", "127.0.0.1"), None) as (node, _):
            assert node.system_root is not None
    finally:
        assert served.stop() == 0, served.log()


def test_version_prints_the_package_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"mycelia {__version__}"
