"""Both engines offer the one protocol the rollout code talks to."""
import inspect

from slick.engine.base import Engine
from slick.engines.client import HttpEngine
from slick.engine.local import LocalEngine


def test_local_and_http_engines_implement_the_protocol(tiny_model_dir):
    local = LocalEngine(tiny_model_dir, dtype="fp32", max_running=2)
    try:
        http = HttpEngine(["http://127.0.0.1:9"])  # no connection is made until a call
        for eng in (local, http):
            assert isinstance(eng, Engine)
            for name in ("generate", "update_weights", "abort", "abort_all", "pause_generation",
                         "continue_generation", "health", "get_weight_version", "close"):
                assert inspect.iscoroutinefunction(getattr(eng, name)), (type(eng).__name__, name)
            rid = inspect.signature(eng.generate).parameters["rid"]
            assert rid.default is None, type(eng).__name__
            assert list(inspect.signature(eng.abort).parameters) == ["rid"], type(eng).__name__
    finally:
        local.close_sync()
