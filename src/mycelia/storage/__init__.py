"""mycelia.storage."""
