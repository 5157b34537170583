"""mycelia.entity.backends."""
