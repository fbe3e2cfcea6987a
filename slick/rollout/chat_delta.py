# Old path of slick.chat.delta, kept for custom generate functions written against it (docs/agents.md).
import sys; from slick.chat import delta; sys.modules[__name__] = delta  # noqa: E401,E702
