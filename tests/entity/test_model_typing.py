"""Models are typed constructors: mypy checks ``trx.create(Note, title=5)`` (issue 17).

The snippet is checked by a real ``mypy --strict`` run, as a user's code would be.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SNIPPET = textwrap.dedent(
    """
    from mycelia import Model, Node, Ref, Text


    class Artist(Model, collection="artists"):
        name: str


    class Note(Model, collection="notes"):
        title: str
        seq: int = 0
        body: Text = Text()
        label: str | None = None
        by: Ref[Artist]


    async def use(node: Node) -> None:
        async with node.context().transaction() as trx:
            artist = trx.create(Artist, name="ann")
            note = trx.create(Note, title="fine", body="a str for a Text field", by=artist)
            note.body.insert(0, ">")
            reveal_type(note)
            trx.create(Note, title=5, by=artist.id)  # error: a str field given an int
            trx.create(Note, titel="typo", by=artist.id)  # error: no such field
            trx.create(Note, title="no ref")  # error: a required field missing
            note.seq = "7"  # error: assignment is checked too
    """
)


def test_mypy_checks_the_values_given_to_trx_create(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(snippet),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    out = done.stdout
    errors = {int(line.split(":")[1]): line for line in out.splitlines() if ": error:" in line}
    expected = [n for n, line in enumerate(SNIPPET.splitlines(), 1) if "# error:" in line]
    assert sorted(errors) == expected, out
    assert 'Argument "title" to "create" of "Transaction" has incompatible type "int"' in out
    assert 'Unexpected keyword argument "titel"' in out
    assert 'did you mean "title"' in out
    assert 'Missing named argument "by"' in out
    assert 'Revealed type is "snippet.Note"' in out
