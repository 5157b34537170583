"""mycelia.retrieval."""
