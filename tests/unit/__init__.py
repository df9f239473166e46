"""Unit tests: the core, configuration, docs and rules, on fakes and SQLite; fast."""
