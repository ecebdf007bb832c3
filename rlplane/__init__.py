"""The `rlplane` command line: a client of the control plane's REST API (/api/v1/).

It imports no Django and no engine internals; engine.config validates a TOML locally
before it is sent, so a bad field is named without a round trip.
"""
