"""The `llamaq` command: one entry point for every process of the fleet."""
