"""Development helpers shared by the tests, the benchmarks and the soak (not shipped):
the pinned Azurite, the test database servers, the test-only ODBC dialect."""
