"""Prompt data on its way in (datasets, DataSource) and finished groups on their way to training
(RolloutBuffer)."""
from slick.data.buffer import RolloutBuffer
from slick.data.dataset import DataError, PromptDataset, load_prompt_rows, parse_spec
from slick.data.source import DataSource

__all__ = ["DataError", "DataSource", "PromptDataset", "RolloutBuffer", "load_prompt_rows", "parse_spec"]
