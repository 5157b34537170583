"""An adversarial corpus: hostile frames a live node must refuse, leaving nothing behind.

Generate (and check in) with::

    python -m mycelia.testing.corpus --write tests/testing/corpus/
    python -m mycelia.testing.corpus --check tests/testing/corpus/   # exit 1 if stale

Every item is a list of wire frames sent to a node served by :func:`mycelia.serve`,
either raw (before any handshake) or after a completed handshake, plus the outcomes it
may get: ``error:<Kind>`` (an :class:`~mycelia.proto.peering.ErrorResponse` naming a
:class:`~mycelia.errors.MyceliaError` class), ``rejected`` (a ``PresenceRejected`` frame,
then a close) or ``close``. Categories: malformed frames and handshakes, forged ids (bytes
of a real event altered), foreign parents, oversized clocks and batches, cycles by claim,
phantom entities, replays from another system, reserved collections, malformed operations
and bad queries (the items: :mod:`mycelia.testing.corpus_items`, built from the fixture of
:mod:`mycelia.testing.corpus_fixture`).

Invariants:

- Items target :func:`open_fixture`, a node whose entropy is a fixed seed, so its system
  root and events are the same every time; the manifest records the root, and the corpus
  test checks the fixture still matches it before sending anything.
- Generation is deterministic, so ``--check`` can tell when the checked-in files are stale.
- Every item must be refused and must change nothing in the node's storage.

Frames larger than a few tens of kilobytes are not checked in (a 4 MiB frame, a 1 MiB
operation): the corpus test builds those at run time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from mycelia.proto import EntityId
from mycelia.testing.corpus_fixture import CorpusItem, CorpusNote, Fixture, open_fixture
from mycelia.testing.corpus_items import all_items

__all__ = [
    "CORPUS_VERSION",
    "CorpusItem",
    "CorpusNote",
    "Fixture",
    "build_corpus",
    "load_corpus",
    "main",
    "open_fixture",
    "write_corpus",
]

CORPUS_VERSION: Final = 1
FOREIGN_SEED: Final = "mycelia-corpus/foreign/1"
MANIFEST: Final = "manifest.json"


async def build_corpus() -> tuple[Fixture, list[CorpusItem]]:
    """The fixture and every corpus item (deterministic; see the module docstring)."""
    fixture = await open_fixture()
    foreign = await open_fixture(FOREIGN_SEED)
    foreign_root = (await foreign.node.system_events())[0].event
    return fixture, all_items(fixture, foreign, foreign_root)


def write_corpus(directory: Path, root: EntityId, items: Sequence[CorpusItem]) -> None:
    """Write ``manifest.json`` and one ``<item>.<n>.bin`` per frame into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for item in items:
        names = []
        for n, frame in enumerate(item.frames):
            names.append(f"{item.name}.{n}.bin")
            (directory / names[-1]).write_bytes(frame)
        announced = None if item.handshake_root is None else item.handshake_root.hex()
        entries.append(
            {
                "name": item.name,
                "category": item.category,
                "description": item.description,
                "phase": item.phase,
                "handshake_root": announced,
                "frames": names,
                "expect": list(item.expect),
            }
        )
    manifest = {"version": CORPUS_VERSION, "fixture_root": bytes(root).hex(), "items": entries}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def load_corpus(directory: Path) -> tuple[EntityId, list[CorpusItem]]:
    """Read a corpus written by :func:`write_corpus`: the fixture's root and the items."""
    manifest = json.loads((directory / MANIFEST).read_text())
    items = []
    for entry in manifest["items"]:
        announced = entry["handshake_root"]
        items.append(
            CorpusItem(
                name=entry["name"],
                category=entry["category"],
                description=entry["description"],
                frames=tuple((directory / f).read_bytes() for f in entry["frames"]),
                expect=tuple(entry["expect"]),
                phase=entry["phase"],
                handshake_root=None if announced is None else bytes.fromhex(announced),
            )
        )
    return EntityId(bytes.fromhex(manifest["fixture_root"])), items


def main(argv: Sequence[str] | None = None) -> int:
    """``--write DIR`` regenerates the corpus; ``--check DIR`` returns 1 if it is stale."""
    parser = argparse.ArgumentParser(prog="python -m mycelia.testing.corpus")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, metavar="DIR")
    group.add_argument("--check", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    fixture, items = asyncio.run(build_corpus())
    if args.write is not None:
        write_corpus(args.write, fixture.root, items)
        sys.stdout.write(f"wrote {len(items)} items to {args.write}\n")
        return 0
    root, stored = load_corpus(args.check)
    if root != fixture.root or stored != items:
        sys.stdout.write(f"{args.check} is stale: run --write {args.check}\n")
        return 1
    sys.stdout.write(f"{args.check} is current ({len(items)} items)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
