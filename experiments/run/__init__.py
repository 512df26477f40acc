"""A run's life: its setup, its record, the server's and the collectives' sides, resume."""
