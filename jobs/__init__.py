"""The operator's world: runs, configs, metric series, alerts (filled in by the control-plane
issue). Reaches the engine only through engine.api and engine.config."""
