"""Learner: the policy update (GRPO), its losses, the warm start and checkpoints."""
