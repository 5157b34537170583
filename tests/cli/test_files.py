"""The ``mycelia`` console script on damaged, missing, read-only and misnamed stores.

Issue 16, defects 8 and 12: each test runs the real console script in a subprocess, as an
operator would (a crash shows as a signal in the return code, never in the test runner).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mycelia import EntityId
from mycelia.storage.lmdb import LmdbStorage
from mycelia.storage.testing import engine_content
from tests.storage.test_lmdb_files import copy_of, cut, fill, read_only_mount
from tests.storage.test_load import Items, forge_state, items


def forge_text(values: Items, entity: EntityId) -> bytes:
    """The dump with ``entity``'s text field forged (state and queryable values alike)."""

    def change(rows: Items, queryable: dict[str, object]) -> None:
        for row in rows:
            if row[0] == "text":
                row[1] = row[1][:-1] + b"!"
        queryable["text"] = str(queryable["text"])[:-1] + "!"

    return forge_state(values, entity, change)


MYCELIA = str(Path(sys.executable).parent / "mycelia")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "store"
    asyncio.run(fill(path))
    return path


def mycelia(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, MYCELIA, *args], capture_output=True, text=True, timeout=60, check=False
    )


def errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("command", ["inspect", "dump", "serve"])
@pytest.mark.parametrize("size", [12 * 1024, 16 * 1024, "half"])
def test_a_truncated_store_is_refused_with_one_line_not_a_bus_error(
    store: Path, tmp_path: Path, command: str, size: int | str
) -> None:
    copy = copy_of(store, tmp_path)
    cut(copy, (copy / "data.mdb").stat().st_size // 2 if size == "half" else int(size))
    args = (
        ["serve", "--data", str(copy), "--port", "0"]
        if command == "serve"
        else [command, str(copy)]
    )
    if command == "dump":
        args.append(str(tmp_path / "out.dump"))
    done = mycelia(*args)
    assert 0 < done.returncode < 128, (done.returncode, done.stderr)  # 135 was SIGBUS
    (line,) = errors(done)
    assert "StorageCorrupt" in line
    assert "cut short" in line
    assert "Traceback" not in done.stderr


def test_serve_on_a_zero_length_data_file_refuses_instead_of_starting_a_new_system(
    store: Path, tmp_path: Path
) -> None:
    copy = copy_of(store, tmp_path)
    cut(copy, 0)
    done = mycelia("serve", "--data", str(copy), "--port", "0")
    assert 0 < done.returncode < 128, (done.returncode, done.stderr)
    (line,) = errors(done)
    assert "empty" in line
    assert (copy / "data.mdb").stat().st_size == 0


@pytest.mark.parametrize("command", ["inspect", "dump"])
def test_inspect_and_dump_of_a_missing_path_say_so_and_create_nothing(
    tmp_path: Path, command: str
) -> None:
    missing = tmp_path / "nothing" / "here"
    args = [command, str(missing)] + ([str(tmp_path / "out.dump")] if command == "dump" else [])
    done = mycelia(*args)
    assert done.returncode == 2, done.stderr
    (line,) = errors(done)
    assert "no store" in line
    assert not (tmp_path / "nothing").exists()
    assert not (tmp_path / "out.dump").exists()


def test_inspect_of_an_empty_directory_creates_nothing_in_it(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = mycelia("inspect", str(tmp_path / "empty"))
    assert done.returncode == 2, done.stderr
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize("command", ["serve", "inspect", "dump", "load"])
def test_a_data_path_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    (tmp_path / "file").write_bytes(b"plain file")
    (tmp_path / "some.dump").write_bytes(b"")
    args = {
        "serve": ["serve", "--data", str(tmp_path / "file"), "--port", "0"],
        "inspect": ["inspect", str(tmp_path / "file")],
        "dump": ["dump", str(tmp_path / "file"), str(tmp_path / "out.dump")],
        "load": ["load", str(tmp_path / "some.dump"), str(tmp_path / "file")],
    }[command]
    done = mycelia(*args)
    assert done.returncode == 2, done.stderr
    (line,) = errors(done)
    assert "is a file" in line
    assert "Traceback" not in done.stderr
    assert (tmp_path / "file").read_bytes() == b"plain file"


def test_a_store_on_a_read_only_file_system_can_be_inspected_and_dumped(
    store: Path, tmp_path: Path
) -> None:
    copy = copy_of(store, tmp_path)
    names = sorted(p.name for p in copy.iterdir())
    prefix = tuple(read_only_mount(copy))
    shown = mycelia("inspect", str(copy), prefix=prefix)
    assert shown.returncode == 0, shown.stderr
    assert "notes: 1000 entities" in shown.stdout
    dumped = mycelia("dump", str(copy), str(tmp_path / "ro.dump"), prefix=prefix)
    assert dumped.returncode == 0, dumped.stderr
    assert "dumped 1001 entities" in dumped.stderr
    assert sorted(p.name for p in copy.iterdir()) == names
    loaded = mycelia("load", str(tmp_path / "ro.dump"), str(tmp_path / "again"))
    assert loaded.returncode == 0, loaded.stderr
    again = mycelia("inspect", str(tmp_path / "again"))
    assert "notes: 1000 entities" in again.stdout


def test_a_backup_of_data_mdb_alone_is_inspected_without_gaining_files(
    store: Path, tmp_path: Path
) -> None:
    backup = tmp_path / "backup"
    backup.mkdir()
    shutil.copy(store / "data.mdb", backup / "data.mdb")
    done = mycelia("inspect", str(backup))
    assert done.returncode == 0, done.stderr
    assert "notes: 1000 entities" in done.stdout
    assert sorted(p.name for p in backup.iterdir()) == ["data.mdb"]


async def content_of(path: Path) -> list[object]:
    storage = LmdbStorage(path, readonly=True)
    try:
        return await engine_content(storage)
    finally:
        await storage.close()


@pytest.mark.parametrize("case", ["cut in half", "forged state", "another system"])
def test_load_of_a_bad_dump_refuses_it_and_changes_nothing(
    store: Path, tmp_path: Path, case: str
) -> None:
    dump = tmp_path / "good.dump"
    assert mycelia("dump", str(store), str(dump)).returncode == 0
    blob = dump.read_bytes()
    if case == "cut in half":
        bad, error = blob[: len(blob) // 2], "DecodeError"
    elif case == "forged state":
        values = items(blob)
        note = next(EntityId(v[1]) for v in values if v[0] == "state" and len(v[3]) > 20)
        bad, error = forge_text(values, note), "InvalidState"
    else:
        asyncio.run(fill(tmp_path / "other", commits=1))
        assert mycelia("dump", str(tmp_path / "other"), str(dump)).returncode == 0
        bad, error = dump.read_bytes(), "ForeignSystem"
    (tmp_path / "bad.dump").write_bytes(bad)
    target = copy_of(store, tmp_path)
    before = asyncio.run(content_of(target))
    done = mycelia("load", str(tmp_path / "bad.dump"), str(target))
    assert done.returncode == 1, done.stderr
    assert error in errors(done)[-1]
    assert asyncio.run(content_of(target)) == before


def test_a_refused_load_into_a_new_path_leaves_no_store_behind(store: Path, tmp_path: Path) -> None:
    dump = tmp_path / "good.dump"
    assert mycelia("dump", str(store), str(dump)).returncode == 0
    (tmp_path / "cut.dump").write_bytes(dump.read_bytes()[:5000])
    done = mycelia("load", str(tmp_path / "cut.dump"), str(tmp_path / "new"))
    assert done.returncode == 1, done.stderr
    assert "truncated" in errors(done)[-1]
    assert not (tmp_path / "new").exists()
