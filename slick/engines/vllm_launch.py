"""Launch real vLLM servers as slick's rollout engines (SGLang's: slick/engines/sglang_launch.py).

    procs = launch_vllm(model_dir, 2, weight_dir=run_dir / "weights", options={"max_num_seqs": "64"})
    VllmEngine([p.url for p in procs], api_key=procs[0].api_key)

vLLM lives in an environment of its own (``make vllm`` makes ``.venv-vllm``: vLLM caps transformers below slick's
and pulls heavy extras), found by :func:`engine_python`. Each server is ``python -m vllm.entrypoints.openai.api_server``
on a free loopback port, run under slick's parent watch (``slick.proc``: it exits when the driver dies, SIGKILL
included), in a session of its own, with:

* ``VLLM_SERVER_DEV_MODE=1`` and ``--enable-scale-out`` (the pause, weight-update and token-in/token-out routes),
* ``--weight-transfer-config {"backend": "slick_dir"}`` and ``SLICK_VLLM_WEIGHT_DIRS`` = the run's weight directory
  (slick/engines/vllm_plugin.py), ``--middleware slick.engines.vllm_plugin.Guard`` with a fresh random API key,
* ``--logprobs-mode processed_logprobs`` (the sampled token's logprob under softmax(logits / T), as slick's trainer
  computes it), ``--seed``, ``--dtype``, ``--structured-outputs-config {"backend": "guidance"}`` (llguidance: the
  grammars of forced tool calls and structured output are its Lark, as for SGLang), and every ``--vllm-KEY VALUE``
  the user gave, as ``--KEY VALUE``;
* for a LoRA run, ``--enable-lora --max-lora-rank R --max-loras 1`` (:func:`lora_options`) and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``: the weight sync loads the adapter with ``/v1/load_lora_adapter``.

A server that exits before it is healthy (a bad ``--vllm-*`` option, not enough memory) or is not healthy within
``startup_timeout`` seconds ends the launch with vLLM's own error line quoted, and every server started is stopped.
"""
from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

from slick.engines.router import WorkerProcess, _log_path, free_port
from slick.proc.children import foreign_engine_env, watch_parent_args

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
SGLANG_MODULE = "sglang.launch_server"
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ENV = ROOT / ".venv-vllm"
SGLANG_ENV = ROOT / ".venv-sglang"


def engine_python(explicit: Optional[str], module: str = "vllm") -> str:
    """The Python that runs ``module``'s servers: ``--rollout-engine-python``, else ``$SLICK_VLLM_PYTHON`` /
    ``$SLICK_SGLANG_PYTHON``, else ``.venv-vllm/bin/python`` (``make vllm``) / ``.venv-sglang/bin/python``
    (``make sglang``), else this Python. Raises FileNotFoundError naming what was looked for when none of them can
    import ``module``."""
    env_var = f"SLICK_{module.upper()}_PYTHON"
    own = DEFAULT_ENV if module == "vllm" else SGLANG_ENV
    candidates = [explicit, os.environ.get(env_var), str(own / "bin" / "python"), sys.executable]
    for c in [c for c in candidates if c]:
        if Path(c).exists() and _has_module(c, module):
            return c
    raise FileNotFoundError(f"no Python with {module} found (looked at --rollout-engine-python, ${env_var}, "
                            f"{own} and {sys.executable}): run `make {module}` (it makes {own.name}), "
                            f"or name one with --rollout-engine-python")


def _has_module(python: str, module: str) -> bool:
    """Whether ``python`` has ``module`` installed (found on its path; nothing is imported)."""
    code = f"import importlib.util,sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def option_args(options: dict) -> list[str]:
    """``{key: value}`` (from ``--vllm-KEY VALUE``) as the server's own ``--key value`` arguments."""
    out = []
    for k, v in (options or {}).items():
        name = "--" + str(k).replace("_", "-")
        out += [name] if v is True else [name, str(v)]
    return out


class EngineServer(WorkerProcess):
    """One vLLM or SGLang server process (``api_key``: the key its requests need)."""

    name = "vLLM server"

    def __init__(self, cmd, url, log_path, env, api_key: Optional[str], module: str):
        self.module, self.api_key = module, api_key
        super().__init__(cmd, url, log_path, env)
        self.name = "vLLM server" if module == VLLM_MODULE else "SGLang server"

    def watched(self, cmd: list[str]) -> list[str]:
        return watch_parent_args(cmd, cmd[2]) if cmd[1] == "-m" else cmd

    def stop(self, timeout: float = 20.0) -> Optional[int]:
        """SIGTERM (the server stops its engine processes), then SIGKILL; then whatever is left of its session."""
        code = super().stop(timeout)
        _kill_group(self.pid)
        return code

    def wait_ready(self, timeout: float) -> None:
        try:
            super().wait_ready(timeout)
        except RuntimeError as e:
            raise RuntimeError(f"{self.name} {self.url} failed to start: {error_line(self.log_tail(20000))}\n{e}") \
                from None


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def error_line(log: str) -> str:
    """The line of a server log that says why it stopped (an argparse error, the last exception), else its last."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    hits = [m.group(0) for ln in lines for m in [re.search(r"error: (unrecognized arguments|argument) .*", ln)] if m]
    if hits:
        return hits[-1]
    # the root cause is the first exception a process logged (the ones after it say that another one failed)
    hits = [m.group(0) for ln in lines for m in [re.search(r"\b\w*(Error|Exception): .*", ln)] if m]
    return hits[0] if hits else (lines[-1] if lines else "(empty log)")


def launch_vllm(model: str, n: int, *, weight_dir, python: Optional[str] = None, dtype: str = "auto",
                seed: int = 0, options: Optional[dict] = None, startup_timeout: float = 600.0,
                threads: Optional[int] = None, log_dir: Optional[str] = None,
                api_key: Optional[str] = None) -> list[EngineServer]:
    """Start ``n`` vLLM servers for ``model`` in parallel and wait until each is healthy (module doc); their
    requests need ``api_key`` (a fresh random one when None: ``server.api_key``)."""
    python = engine_python(python, "vllm")
    Path(weight_dir).mkdir(parents=True, exist_ok=True)
    env = dict(foreign_engine_env(os.environ), VLLM_SERVER_DEV_MODE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               SLICK_VLLM_WEIGHT_DIRS=str(Path(weight_dir).resolve()))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")                 # GiB of KV cache per CPU server
    env.setdefault("OMP_NUM_THREADS", str(threads or max(1, (os.cpu_count() or 1) // n)))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")         # share the cores with the trainer
    opts = {"dtype": _vllm_dtype(dtype), "seed": seed, "logprobs_mode": "processed_logprobs",
            "structured_outputs_config": '{"backend": "guidance"}',
            **{str(k).replace("-", "_"): v for k, v in (options or {}).items()}}
    if opts.get("enable_lora"):     # adapters loaded at run time (/v1/load_lora_adapter: a LoRA run's weight sync)
        env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")

    def one(i: int) -> EngineServer:
        port, key = free_port(), api_key or secrets.token_hex(16)
        cmd = [python, "-m", VLLM_MODULE, "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
               "--enable-scale-out", "--weight-transfer-config", '{"backend": "slick_dir"}',
               "--middleware", "slick.engines.vllm_plugin.Guard", *option_args(opts)]
        return EngineServer(cmd, f"http://127.0.0.1:{port}", _log_path(f"vllm{i}-", log_dir),
                            dict(env, SLICK_VLLM_API_KEY=key), key, VLLM_MODULE)
    return _start_all(one, n, startup_timeout)


def _start_all(one, n: int, startup_timeout: float) -> list[EngineServer]:
    if n < 1:
        raise ValueError(f"need at least one engine server, got {n}")
    servers: list[EngineServer] = []
    try:
        for i in range(n):
            servers.append(one(i))
        for s in servers:
            s.wait_ready(startup_timeout)
    except BaseException:
        for s in servers:
            s.stop(timeout=10)
        raise
    return servers


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)     # the values vLLM 0.32 takes for --max-lora-rank


def lora_options(rank: int) -> dict:
    """Server options for a LoRA run of adapter rank ``rank``: LoRA on, one adapter, the smallest
    ``--max-lora-rank`` vLLM takes that holds it (ValueError above 512)."""
    fits = [r for r in VLLM_LORA_RANKS if r >= int(rank)]
    if not fits:
        raise ValueError(f"--lora-rank {rank}: vLLM serves adapters up to rank {VLLM_LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1}


def _vllm_dtype(dtype: str) -> str:
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
