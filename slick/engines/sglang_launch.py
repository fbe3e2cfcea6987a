"""Launch real SGLang servers as slick's rollout engines (``--rollout-engine sglang``; docs/sglang.md).

    procs = launch_sglang(model_dir, 2, dtype="bfloat16")
    SglangEngine([p.url for p in procs], api_key=procs[0].api_key)

SGLang lives in an environment of its own (``make sglang`` makes ``.venv-sglang``), found by
:func:`slick.engines.vllm_launch.engine_python`. Each server is ``python -m sglang.launch_server`` on a free loopback
port, under slick's parent watch (it exits when the driver dies, SIGKILL included), in a session of its own, with a
fresh random ``--api-key``, ``--weight-version 0`` (the trainer's first version), ``--random-seed``, ``--dtype``,
``--grammar-backend llguidance`` (the grammars of forced tool calls and structured output are llguidance's Lark
syntax, slick/serve/openai_constraints.py; SGLang's default backend, xgrammar, reads only GBNF) and every
``--sglang-KEY VALUE`` the user gave as ``--KEY VALUE`` (they win over slick's defaults).

On a CPU (the default, ``--sglang-device cpu``) the server also gets ``SGLANG_USE_CPU_ENGINE=1``, SGLang's
plain-torch attention (``--attention-backend torch_native``), a bounded KV cache (``--max-total-tokens 16384
--mem-fraction-static 0.3``), ``--skip-server-warmup``, ``--disable-radix-cache`` (a weight update under an
in-place pause then needs no cache flush, which SGLang refuses while requests run; sglang_client.py),
``--sleep-on-idle`` (an idle server's scheduler otherwise polls on a whole core, which the trainer needs),
``OMP_NUM_THREADS`` = its share of the cores, and :mod:`slick.engines.sglang_shim` first on its ``PYTHONPATH``
(``sgl_kernel``'s CPU functions in torch, and a torchvision stand-in). A server that exits before it is healthy
(a bad ``--sglang-*`` option) ends the launch with SGLang's own error line quoted, and every server started is
stopped.
"""
from __future__ import annotations

import os
import secrets
from typing import Optional

from slick.engines.router import _log_path, free_port
from slick.engines.sglang_shim import PATH as SHIM_PATH
from slick.engines.vllm_launch import SGLANG_MODULE, EngineServer, _start_all, engine_python, option_args
from slick.proc.children import foreign_engine_env

CPU_DEFAULTS = {"attention_backend": "torch_native", "max_total_tokens": 16384, "mem_fraction_static": 0.3,
                "skip_server_warmup": True, "disable_radix_cache": True, "sleep_on_idle": True}


def sglang_env(base: dict, device: str, threads: int) -> dict:
    """The environment of one server: ``base`` plus, on a CPU, SGLang's CPU engine switch, the shim first on
    ``PYTHONPATH`` and ``OMP_NUM_THREADS`` (unless ``base`` sets it)."""
    env = dict(foreign_engine_env(base), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        env["PYTHONPATH"] = SHIM_PATH + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


def sglang_options(options: Optional[dict], dtype: str, seed: int) -> dict:
    """The server's ``--KEY VALUE`` options: slick's (CPU defaults on a CPU), then the user's ``--sglang-*``."""
    user = {str(k).replace("-", "_"): v for k, v in (options or {}).items()}
    device = str(user.get("device", "cpu"))
    base = {"device": device, "dtype": _sglang_dtype(dtype), "random_seed": seed, "weight_version": 0,
            "grammar_backend": "llguidance", **(CPU_DEFAULTS if device == "cpu" else {})}
    return {**base, **user}


def launch_sglang(model: str, n: int, *, python: Optional[str] = None, dtype: str = "auto", seed: int = 0,
                  options: Optional[dict] = None, startup_timeout: float = 600.0, threads: Optional[int] = None,
                  log_dir: Optional[str] = None, api_key: Optional[str] = None) -> list[EngineServer]:
    """Start ``n`` SGLang servers for ``model`` in parallel and wait until each is healthy (module doc); their
    requests need ``api_key`` (a fresh random one when None: ``server.api_key``)."""
    python = engine_python(python, "sglang")
    opts = sglang_options(options, dtype, seed)
    env = sglang_env(os.environ, str(opts["device"]), threads or max(1, (os.cpu_count() or 1) // n))

    def one(i: int) -> EngineServer:
        port, key = free_port(), api_key or secrets.token_hex(16)
        cmd = [python, "-m", SGLANG_MODULE, "--model-path", str(model), "--host", "127.0.0.1", "--port", str(port),
               "--api-key", key, *option_args(opts)]
        return EngineServer(cmd, f"http://127.0.0.1:{port}", _log_path(f"sglang{i}-", log_dir), env, key,
                            SGLANG_MODULE)
    return _start_all(one, n, startup_timeout)


def _sglang_dtype(dtype: str) -> str:
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
