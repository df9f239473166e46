"""Helpers of the test suite: fixtures' building blocks and the child processes tests start."""
