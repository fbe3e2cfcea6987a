"""slick: RL post-training of LLMs that runs for real on one CPU laptop."""

__version__ = "0.1.0"
