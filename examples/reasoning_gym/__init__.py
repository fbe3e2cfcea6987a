"""reasoning-gym example: procedural reasoning tasks as prompt data, scored by each task's own verifier."""
