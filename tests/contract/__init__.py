"""Contract suites of the ports, run over every adapter (fakes, files, Azurite, databases)."""
