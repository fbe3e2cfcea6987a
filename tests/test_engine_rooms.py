"""engine/ split by role (issue 31): the inference core (slick/engine), the serving front (slick/serve) and the
driver-side engine clients (slick/engines) are three rooms, layered engines > serve > engine in the import-linter
contract, and the core imports nothing of HTTP, serving or training."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from aiohttp import web

from tests import import_graph

ROOT = Path(__file__).resolve().parent.parent
SLICK = ROOT / "slick"

# which module lives in which room: the decision of the split, as data
ROOMS = {
    "engine": {"arch", "base", "batching", "grammar", "kvcache", "linear", "local", "model", "native", "request",
               "sampling", "lora_merge", "scoring", "weight_check", "weight_group", "weight_staging",
               "grammar_check", "limits", "moe", "routing_record"},
    "serve": {"fanout", "http_body", "http_guard", "http_protocol", "messages_api", "openai_api", "openai_constraints",
              "openai_protocol", "openai_stream", "responses_api", "routing_wire", "serve_cli", "server", "sglang_args",
              "sse", "weight_dirs", "weight_group_routes"},
    "engines": {"client", "detect", "fault", "flight", "health", "router", "vllm_client", "vllm_launch", "vllm_plugin",
                "weight_calls", "sglang_client", "sglang_launch", "answer_check", "launch_ready"},
}
# what the inference core must not import: HTTP servers and clients, the rooms above it
NOT_IN_CORE = ("aiohttp", "requests", "httpx", "urllib", "http", "slick.serve", "slick.engines", "slick.train",
               "slick.rollout", "slick.loop", "slick.cluster", "slick.factory")


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every imported module name of ``path`` (module level and function-local), with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def test_modules_by_room():
    for room, modules in ROOMS.items():
        found = {p.stem for p in (SLICK / room).glob("*.py") if p.name != "__init__.py"}
        assert found == modules, f"slick/{room}/: {sorted(found ^ modules)}"
    assert (SLICK / "engine" / "csrc" / "decode.cpp").is_file()     # the native kernels stay with native.py


def test_layers_engines_over_serve_over_engine():
    order = [room for layer in import_graph.layers(ROOT) for room in layer]
    assert order.index("slick.engines") < order.index("slick.serve") < order.index("slick.engine")
    for room in ("slick.engines", "slick.serve", "slick.engine"):
        assert [room] in import_graph.layers(ROOT), f"{room} shares its layer"
    below = order[order.index("slick.rollout"):]
    assert below[:4] == ["slick.rollout", "slick.train", "slick.engines", "slick.serve"]


def test_inference_core_knows_no_http_or_training():
    bad = [f"slick/engine/{p.name}:{line}: {name}" for p in sorted((SLICK / "engine").glob("*.py"))
           for line, name in _imports(p) if any(name == b or name.startswith(b + ".") for b in NOT_IN_CORE)]
    assert bad == []


def test_weight_group_routes_serve_the_core_groups():
    """The aiohttp routes moved to the serving front; the receiving itself stays in the core."""
    import slick.engine.weight_group as core
    from slick.serve.weight_group_routes import WeightGroupRoutes

    assert not hasattr(core, "WeightGroupRoutes")

    class Server:
        engine = object()

    app = web.Application()
    routes = WeightGroupRoutes(Server())
    routes.register(app.router)
    assert isinstance(routes.groups, core.WeightGroups) and routes.groups.engine is Server.engine
    assert sorted(r.resource.canonical for r in app.router.routes()) == sorted(core.PATHS)
    assert {r.method for r in app.router.routes()} == {"POST"}


def test_slick_serve_entry_point():
    out = subprocess.run([sys.executable, "-m", "slick.cli", "serve", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--hf-checkpoint" in out.stdout
    from slick import cli

    assert cli.COMMANDS["serve"][0] == "slick.serve.serve_cli"
