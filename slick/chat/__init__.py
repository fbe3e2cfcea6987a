"""Chat-template deltas and tool-call parsing: the low room both the serving front (slick/serve/openai_*) and
the rollout (multi-turn, agent sessions) use. Knows the tokenizer's chat template and JSON, no room above it."""
