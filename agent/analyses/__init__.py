"""The analyses: they read the store and records, and hand their results back to the store and sinks."""
