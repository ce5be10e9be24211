"""Per-request sources: OTLP trace spans from the engine, AIPerf's exports."""
