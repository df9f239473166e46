"""Run observers: OpenTelemetry metrics."""
