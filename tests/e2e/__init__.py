"""End to end: real processes (the CLI, the Functions worker, pollers killed mid-batch)."""
