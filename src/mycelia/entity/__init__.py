"""mycelia.entity."""
