"""slick's side inside a vLLM server: a weight-transfer backend for CPU and a request guard.

This module runs in vLLM's processes (its own environment, made by ``make vllm``), never in slick's driver: slick is
installed there without dependencies and this module is registered as a vLLM general plugin (the
``vllm.general_plugins`` entry point in pyproject.toml), which vLLM loads in its API server, engine core and
workers. It imports only vLLM, torch, safetensors and the standard library.

* **``slick_dir``, a weight-transfer backend** (``--weight-transfer-config '{"backend": "slick_dir"}'``). vLLM's
  own backends (nccl, ipc, ...) move GPU memory; on CPU slick writes the trainer's weights as a safetensors
  directory (its disk transport: ``slick.weights.transport.disk``, under the run directory, renamed into place
  atomically) and vLLM's standard weight-update sequence loads it: ``/start_weight_update`` ->
  ``/update_weights {"update_info": {"path": DIR}}`` -> ``/finish_weight_update {"weight_version": V}``. Within
  the one ``/update_weights`` call the worker checks the directory, then streams each tensor out of the
  memory-mapped files into ``model.load_weights`` inside vLLM's layerwise reload, as the IPC backend does, so vLLM's
  own post-processing (its CPU kernels' weight repacking) runs; a refused directory leaves the model untouched. ``path`` must lie under one of the directories
  in ``SLICK_VLLM_WEIGHT_DIRS`` (``os.pathsep``-separated, set by slick when it launches the server), so a client
  cannot make the server read arbitrary files.
* **``Guard``, an ASGI middleware** (``--middleware slick.engines.vllm_plugin.Guard``): vLLM's ``--api-key`` covers
  ``/v1`` only, and slick needs vLLM's development routes (``VLLM_SERVER_DEV_MODE=1``: ``/pause``, the weight
  update, ``/collective_rpc``). The guard applies slick's serving rules (docs/security.md) to every route: the Host
  header must name the loopback address it is bound to, a request carrying a foreign ``Origin`` is refused, a POST
  must say ``Content-Type: application/json``, and with ``SLICK_VLLM_API_KEY`` set every route but ``/health``,
  ``/metrics`` and ``/ping`` needs ``Authorization: Bearer KEY``. ``/v1/load_lora_adapter`` (a LoRA run's weight
  sync) is held to the weight update's rule: its ``lora_path`` must lie under ``SLICK_VLLM_WEIGHT_DIRS``, so the
  key alone does not let a client make the server read any directory it can.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

BACKEND = "slick_dir"
WEIGHT_DIRS_ENV = "SLICK_VLLM_WEIGHT_DIRS"
API_KEY_ENV = "SLICK_VLLM_API_KEY"
OPEN_PATHS = {"/health", "/metrics", "/ping"}
ADAPTER_ROUTES = {"/v1/load_lora_adapter"}     # POST bodies naming a directory the server will read
MAX_ADAPTER_BODY = 1 << 20


def register() -> None:
    """vLLM general-plugin entry point: register the ``slick_dir`` backend (idempotent: vLLM may load plugins more
    than once in a process)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "SlickDirEngine")


def allowed_weight_path(path: str) -> Path:
    """``path`` resolved, if it lies under a directory of ``SLICK_VLLM_WEIGHT_DIRS``; ValueError otherwise."""
    roots = [Path(p).resolve() for p in os.environ.get(WEIGHT_DIRS_ENV, "").split(os.pathsep) if p]
    real = Path(path).resolve()
    if not any(real == r or r in real.parents for r in roots):
        raise ValueError(f"weight path {path!r} is not under the directories this server loads weights from "
                         f"({WEIGHT_DIRS_ENV}={[str(r) for r in roots]})")
    if not real.is_dir():
        raise ValueError(f"weight path {path!r} is not a directory")
    return real


def iter_dir_tensors(path: Path):
    """``(name, tensor)`` from every ``*.safetensors`` file of ``path``, memory-mapped, in name order."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors files in {path}")
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                yield name, st.get_tensor(name)


def repack_shared_embeddings(model) -> None:
    """Re-run the weight post-processing of every embedding-method layer (the output head included). On CPU
    it packs a copy of its weight for oneDNN; a tied output head shares the input embedding's weight but receives
    no checkpoint tensor of its own, so the layerwise reload leaves its packed copy at the old weights."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod) and hasattr(module, "cpu_linear"):
            method.process_weights_after_loading(module)


@functools.cache
def _engine_classes():
    from vllm.distributed.weight_transfer.base import (WeightTransferEngine, WeightTransferInitInfo,
                                                       WeightTransferUpdateInfo)

    @dataclass
    class SlickDirInitInfo(WeightTransferInitInfo):
        pass

    @dataclass
    class SlickDirUpdateInfo(WeightTransferUpdateInfo):
        path: str

    class SlickDirEngine(WeightTransferEngine[SlickDirInitInfo, SlickDirUpdateInfo]):
        """Loads a safetensors directory written by slick (module doc)."""

        init_info_cls = SlickDirInitInfo
        update_info_cls = SlickDirUpdateInfo
        supports_draft_weight_update = False

        def init_transfer_engine(self, init_info) -> None:
            pass                                      # no rendezvous: the directory is the channel

        def start_weight_update(self) -> None:
            pass                                      # the whole load happens in one receive_weights

        def receive_weights(self, update_info) -> None:
            # the directory is checked before the model is touched: a refused path leaves the weights in place
            from vllm.model_executor.model_loader.reload import (finalize_layerwise_reload,
                                                                 initialize_layerwise_reload)
            path = allowed_weight_path(update_info.path)
            if not any(path.glob("*.safetensors")):
                raise ValueError(f"no .safetensors files in {update_info.path}")
            initialize_layerwise_reload(self.model)
            self.model.load_weights(iter_dir_tensors(path))
            finalize_layerwise_reload(self.model, self.model_config)   # vLLM's post-processing (CPU repacking)
            repack_shared_embeddings(self.model)

        def finish_weight_update(self) -> None:
            pass

        def update_weights(self, update_info) -> None:
            # the base class synchronises an accelerator after each chunk; on CPU there is none to wait for
            self.receive_weights(self.parse_update_info(update_info))

        def shutdown(self) -> None:
            pass

    return SlickDirEngine


async def _buffered(receive):
    """The request body read whole (at most ``MAX_ADAPTER_BODY`` bytes are kept; None past that), and a
    ``receive`` that hands it to the app as one message."""
    chunks, size, more = [], 0, True
    while more:
        msg = await receive()
        if msg.get("type") != "http.request":
            break
        size += len(msg.get("body", b""))
        if size <= MAX_ADAPTER_BODY:
            chunks.append(msg.get("body", b""))
        more = msg.get("more_body", False)
    body = b"".join(chunks) if size <= MAX_ADAPTER_BODY else None
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body or b"", "more_body": False}
        return await receive()
    return body, replay


def adapter_problem(body):
    """``(status, message)`` when a load-adapter body names a ``lora_path`` outside ``SLICK_VLLM_WEIGHT_DIRS``."""
    if body is None:
        return 413, f"request body over {MAX_ADAPTER_BODY} bytes"
    try:
        path = json.loads(body or b"{}").get("lora_path")
    except (ValueError, AttributeError):
        return 400, "the body is not a JSON object"
    if path is None:
        return None                                   # vLLM answers a request without a path itself
    try:
        allowed_weight_path(str(path))
    except ValueError as e:
        return 403, f"lora_path refused: {e}"
    return None


def __getattr__(name):   # the factory imports ``SlickDirEngine`` lazily, once vLLM is importable
    if name == "SlickDirEngine":
        return _engine_classes()
    raise AttributeError(name)


class Guard:
    """ASGI middleware applying slick's serving rules to every route of a vLLM server (module doc)."""

    def __init__(self, app):
        self.app = app
        self.api_key = os.environ.get(API_KEY_ENV) or None

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        problem = self.refuse(scope)
        if problem is None and scope.get("method") == "POST" and scope.get("path") in ADAPTER_ROUTES:
            body, receive = await _buffered(receive)
            problem = adapter_problem(body)
        if problem is None:
            return await self.app(scope, receive, send)
        status, message = problem
        body = json.dumps({"error": {"message": message, "code": status}}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def refuse(self, scope):
        """``(status, message)`` for a request the rules refuse, else None."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        server = scope.get("server") or ("", 0)
        host = headers.get("host", "")
        names = {f"127.0.0.1:{server[1]}", f"localhost:{server[1]}", "127.0.0.1", "localhost"}
        if host not in names:
            return 421, f"Host {host!r} is not this server's address"
        origin = headers.get("origin")
        if origin is not None and origin.split("://", 1)[-1] not in names:
            return 403, f"cross-origin request from {origin!r} refused"
        path = scope.get("path", "")
        if self.api_key and path not in OPEN_PATHS:
            if headers.get("authorization", "") != f"Bearer {self.api_key}":
                return 401, "missing or wrong API key (Authorization: Bearer KEY)"
        if scope.get("method") == "POST":
            ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                return 415, f"POST {path} needs Content-Type: application/json"
        return None
