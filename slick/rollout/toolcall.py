# Old path of slick.chat.toolcall, kept for custom generate functions and --tool-parser plug-ins (docs/agents.md).
import sys; from slick.chat import toolcall; sys.modules[__name__] = toolcall  # noqa: E401,E702
