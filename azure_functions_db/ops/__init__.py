"""Operator use cases: status, seek, validate and the demo. Each returns data; the CLI prints it."""
