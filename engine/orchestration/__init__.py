"""Orchestration: placement and deployment, the workers, async policies and the RL loop."""
