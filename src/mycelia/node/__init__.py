"""mycelia.node."""
