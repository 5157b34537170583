"""LmdbStorage on damaged, empty, missing and read-only data files (issue 16, defects 8, 12).

A truncated ``data.mdb`` used to kill the process with SIGBUS when LMDB touched a page past
the end of the file, so every open of a damaged file runs in a child process here: a
SIGBUS shows as a negative return code instead of taking the test runner down.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mycelia import Model, Node
from mycelia.errors import StorageCorrupt, StorageNotFound
from mycelia.storage.lmdb import LmdbStorage
from mycelia.storage.testing import engine_content

CHILD = """
import asyncio, sys
from mycelia.errors import MyceliaError
from mycelia.storage.lmdb import LmdbStorage
from mycelia.storage.testing import engine_content

async def main():
    storage = LmdbStorage(sys.argv[1], readonly=sys.argv[2] == "ro")
    try:
        await engine_content(storage)  # touches every page a dump reads
    finally:
        await storage.close()

try:
    asyncio.run(main())
except MyceliaError as exc:
    print(type(exc).__name__, exc)
    sys.exit(3)
print("opened")
"""


class Note(Model, collection="notes"):
    text: str


async def fill(path: Path, *, commits: int = 20) -> None:
    node = await Node.open(LmdbStorage(path, durable=False), durable=True)
    await node.create_system()
    for _ in range(commits):
        async with node.context().transaction() as trx:
            for _ in range(50):
                trx.create(Note, text="x" * 200)
    await node.close()


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of about 3.7 MB (900+ pages), made once and copied by each test."""
    path = tmp_path_factory.mktemp("lmdb") / "store"
    asyncio.run(fill(path))
    return path


def copy_of(store: Path, where: Path) -> Path:
    target = where / "copy"
    shutil.copytree(store, target)
    return target


def open_in_child(path: Path, *, readonly: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(path), "ro" if readonly else "rw"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def cut(path: Path, size: int) -> None:
    with (path / "data.mdb").open("r+b") as f:
        f.truncate(size)


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "read-only"])
@pytest.mark.parametrize("size", [12 * 1024, 16 * 1024, "half", 5000, 100])
def test_a_truncated_data_file_is_refused_as_corrupt_instead_of_crashing(
    filled_store: Path, tmp_path: Path, size: int | str, readonly: bool
) -> None:
    store = copy_of(filled_store, tmp_path)
    full = (store / "data.mdb").stat().st_size
    cut(store, full // 2 if size == "half" else int(size))
    before = (store / "data.mdb").read_bytes()
    child = open_in_child(store, readonly=readonly)
    assert child.returncode == 3, (child.returncode, child.stdout, child.stderr)  # not -SIGBUS
    assert child.stdout.startswith("StorageCorrupt"), child.stdout
    assert "cut short" in child.stdout  # (not a word of the test's own path)
    assert (store / "data.mdb").read_bytes() == before  # the refusal changed nothing


def test_a_file_longer_than_its_used_pages_still_opens(filled_store: Path, tmp_path: Path) -> None:
    store = copy_of(filled_store, tmp_path)
    full = (store / "data.mdb").stat().st_size
    cut(store, full + 3 * 4096)  # LMDB files may be longer than their last used page
    child = open_in_child(store)
    assert child.returncode == 0, (child.stdout, child.stderr)
    assert child.stdout.strip() == "opened"


def test_a_data_file_with_a_bad_meta_page_is_refused(filled_store: Path, tmp_path: Path) -> None:
    store = copy_of(filled_store, tmp_path)
    with (store / "data.mdb").open("r+b") as f:
        f.seek(16)
        f.write(b"\0\0\0\0")  # the first meta page's magic
    child = open_in_child(store)
    assert child.returncode == 3, (child.returncode, child.stdout, child.stderr)
    assert child.stdout.startswith("StorageCorrupt"), child.stdout


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "read-only"])
def test_a_zero_length_data_file_is_refused_not_taken_for_a_new_store(
    filled_store: Path, tmp_path: Path, readonly: bool
) -> None:
    store = copy_of(filled_store, tmp_path)
    cut(store, 0)
    with pytest.raises(StorageCorrupt, match="empty"):
        LmdbStorage(store, readonly=readonly)
    assert (store / "data.mdb").stat().st_size == 0  # no new system was started in it


def test_a_read_only_open_of_a_missing_path_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(StorageNotFound, match="no store"):
        LmdbStorage(tmp_path / "missing", readonly=True)
    assert not (tmp_path / "missing").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(StorageNotFound, match="no store"):
        LmdbStorage(tmp_path / "empty", readonly=True)
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "read-only"])
def test_a_path_that_is_a_file_is_refused_with_a_typed_error(
    tmp_path: Path, readonly: bool
) -> None:
    (tmp_path / "file").write_bytes(b"not a directory")
    with pytest.raises(StorageNotFound, match="is a file"):
        LmdbStorage(tmp_path / "file", readonly=readonly)
    assert (tmp_path / "file").read_bytes() == b"not a directory"


async def test_a_backup_holding_only_data_mdb_opens_read_only_and_gains_no_files(
    filled_store: Path, tmp_path: Path
) -> None:
    backup = tmp_path / "backup"
    backup.mkdir()
    shutil.copy(filled_store / "data.mdb", backup / "data.mdb")
    original = LmdbStorage(filled_store, readonly=True)
    try:
        expected = await engine_content(original)
    finally:
        await original.close()
    storage = LmdbStorage(backup, readonly=True)
    try:
        assert await engine_content(storage) == expected
    finally:
        await storage.close()
    assert sorted(p.name for p in backup.iterdir()) == ["data.mdb"]


def read_only_mount(path: Path) -> list[str]:
    """A command prefix that runs its command with ``path`` on a read-only bind mount (a
    real read-only file system: EROFS), or skips saying what is missing."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("a read-only mount needs util-linux's unshare, which is not installed")
    probe = subprocess.run(
        [unshare, "-r", "--mount", "sh", "-c", f"mount --bind -o ro '{path}' '{path}'"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"this machine allows no user-namespace bind mount: {probe.stderr.strip()}")
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'  # $0: the path, "$@": the command
    return [unshare, "-r", "--mount", "sh", "-c", script, str(path)]


def test_a_store_on_a_read_only_file_system_opens_read_only(
    filled_store: Path, tmp_path: Path
) -> None:
    store = copy_of(filled_store, tmp_path)
    names = sorted(p.name for p in store.iterdir())
    child = subprocess.run(
        [*read_only_mount(store), sys.executable, "-c", CHILD, str(store), "ro"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, (child.stdout, child.stderr)
    assert child.stdout.strip() == "opened"
    assert sorted(p.name for p in store.iterdir()) == names
    assert os.access(store, os.W_OK)  # the mount was private to the child
