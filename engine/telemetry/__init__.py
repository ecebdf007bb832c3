"""Telemetry: phase spans and the metrics derived from them, and the event sinks."""
