"""mycelia.event_dag."""
