"""Orchestration: placement, the rollout producer, async policies and the run driver."""
