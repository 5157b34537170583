"""``python -m mycelia.cli``: the ``mycelia`` command."""

from mycelia.cli.main import run

run()
