"""What the command line shows a person: one id format, progress that suits where it goes,
and no binary on a terminal (issue 17)."""

from __future__ import annotations

import asyncio
import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from mycelia import Model, Node
from mycelia.node.progress import Progress
from mycelia.storage.lmdb import LmdbStorage

MYCELIA = str(Path(sys.executable).parent / "mycelia")


class Note(Model, collection="notes"):
    text: str


async def fill(path: Path, count: int) -> str:
    """A store with ``count`` notes; returns its system root as ``str`` prints it."""
    node = await Node.open(LmdbStorage(path), durable=True)
    root = await node.create_system()
    async with node.context().transaction() as trx:
        for i in range(count):
            trx.create(Note, text=f"n{i}")
    await node.close()
    return str(root)


def on_a_terminal(args: list[str], *, stdout: bool, stderr: bool) -> tuple[int, str]:
    """Run ``mycelia args`` with stdout and/or stderr on a pseudo-terminal; returns the exit
    code and what the terminal showed."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [MYCELIA, *args],
            stdin=subprocess.DEVNULL,
            stdout=follower if stdout else subprocess.DEVNULL,
            stderr=follower if stderr else subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        os.close(follower)
        follower = -1
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            shown += chunk
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    return done.returncode, shown.decode(errors="replace")


def test_inspect_prints_the_system_root_in_base64_like_every_other_id(tmp_path: Path) -> None:
    root = asyncio.run(fill(tmp_path / "store", 1))
    done = subprocess.run(
        [MYCELIA, "inspect", str(tmp_path / "store")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"system root   {root}\n" in done.stdout
    assert len(root) == 43  # unpadded URL-safe base64, as the serve log prints it


def test_dump_refuses_to_write_binary_to_a_terminal(tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path / "store", 1))
    code, shown = on_a_terminal(["dump", str(tmp_path / "store")], stdout=True, stderr=True)
    assert code == 2
    assert "refusing to write a binary dump to the terminal" in shown
    assert "\x93" not in shown  # nothing of the msgpack stream reached it


def test_progress_in_a_log_file_is_whole_lines_and_one_closing_count(tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path / "store", 50))
    dump = tmp_path / "out.dump"
    done = subprocess.run(
        [MYCELIA, "dump", str(tmp_path / "store"), str(dump)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    assert done.stderr.count("dumped 51 entities") == 1, done.stderr  # 50 notes + the root
    loaded = subprocess.run(
        [MYCELIA, "load", str(dump), str(tmp_path / "copy")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert "\r" not in loaded.stderr
    assert loaded.stderr.count("loaded 51 entities") == 1, loaded.stderr


def test_progress_on_a_terminal_is_a_bar(tmp_path: Path) -> None:
    asyncio.run(fill(tmp_path / "store", 50))
    dump = tmp_path / "out.dump"
    code, _ = on_a_terminal(
        ["dump", str(tmp_path / "store"), str(dump)], stdout=False, stderr=False
    )
    assert code == 0
    code, shown = on_a_terminal(
        ["load", str(dump), str(tmp_path / "copy")], stdout=False, stderr=True
    )
    assert code == 0, shown
    assert "━" in shown  # rich's bar, drawn on the terminal
    assert "checking" in shown


def test_plain_progress_writes_a_line_every_few_seconds_and_one_at_the_end() -> None:
    now = [0.0]
    lines: list[str] = []
    progress = Progress(
        "syncing", unit="entities", terminal=False, write=lines.append, clock=lambda: now[0]
    )
    for step in range(1, 13):
        now[0] = float(step)
        progress.update(step * 100)
    progress.close()
    assert lines == [
        "syncing: 500 entities (5 s) ...",
        "syncing: 1,000 entities (10 s) ...",
        "syncing: 1,200 entities (12 s), done",
    ]


def test_a_terminal_progress_draws_a_bar_with_its_total() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    progress = Progress.on(screen, "loading", unit="entities", total=10)
    progress.update(5)
    progress.close()
    assert "loading" in screen.getvalue()
    assert "10" in screen.getvalue()


@pytest.mark.parametrize("unit", ["entities", "bytes"])
def test_progress_without_a_total_counts(unit: str) -> None:
    lines: list[str] = []
    progress = Progress("dumping", unit=unit, terminal=False, write=lines.append)
    progress.update(3_000_000)
    progress.close("dumped everything")
    assert lines == ["dumped everything"]
