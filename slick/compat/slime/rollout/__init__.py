"""slime.rollout: ``sglang_rollout`` (GenerateState, generate, get_model_url) and ``filter_hub``."""
