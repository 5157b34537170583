"""The ``mycelia`` command line: ``serve``, ``inspect``, ``dump``, ``load``."""

from mycelia.cli.main import main

__all__ = ["main"]
