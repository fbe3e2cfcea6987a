"""Rollout side: turn prompts into scored groups of samples (RolloutManager), filters, eval."""
