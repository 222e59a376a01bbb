"""Strategy components (one module per method) and the composition grammar."""
