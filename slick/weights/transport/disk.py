"""The disk transport: a safetensors directory written atomically, then loaded by every engine.

Layout of ``disk_dir`` after ``send(version, ...)``: ``model-0000i-of-0000n.safetensors`` shards of at most
``bucket_bytes`` each (a larger tensor gets a shard of its own) with ``model.safetensors.index.json`` (HF's
weight map), or one ``model.safetensors`` when everything fits one bucket; ``slick_weights.json`` (the version marker: ``{"version", "tensors", "bytes"}``) and, when
``model_dir`` is given, its config/tokenizer files, so that the directory is a loadable HF model (what
SGLang's ``/update_weights_from_disk`` expects). The directory is written to a sibling temp directory and
renamed into place: an engine never sees half a version. Each engine is then told
``update_weights(path=disk_dir, version=version)`` (HTTP engines: ``/update_weights_from_disk``).
``send_adapter`` (a LoRA run whose engines take adapters: ``slick.weights.lora_sync``) writes a PEFT adapter
directory there instead (``adapter_config.json``, ``adapter_model.safetensors``, the marker) and tells the engines
the same.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterable, Optional, Sequence

import torch

from slick.ckpt.checkpoint import write_dir_atomic
from slick.weights.transport.buckets import iter_buckets, tensor_bytes
from slick.weights.transport.common import bounded, on_every_engine

MARKER = "slick_weights.json"
_SKIP = {".safetensors", ".bin", ".pt", ".pth", ".gguf"}


def write_weights_dir(out_dir, version: int, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int,
                      model_dir: Optional[str] = None) -> Path:
    """Write the directory described in the module doc atomically; return its path."""
    from safetensors.torch import save_file

    def writer(tmp: Path) -> None:
        if model_dir:
            for f in Path(model_dir).iterdir():
                if f.is_file() and f.suffix not in _SKIP and f.name != "model.safetensors.index.json":
                    shutil.copy2(f, tmp / f.name)
        shards, total, count = [], 0, 0
        for i, bucket in enumerate(iter_buckets(named, bucket_bytes)):
            part = tmp / f"part-{i:05d}.safetensors"
            save_file({n: t.detach().to("cpu").contiguous() for n, t in bucket}, str(part))
            shards.append((part, [n for n, _ in bucket]))
            total += sum(tensor_bytes(t) for _, t in bucket)
            count += len(bucket)
        if not count:
            raise ValueError("no tensors to send")
        weight_map = {}
        for i, (part, names) in enumerate(shards):
            final = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            part.rename(tmp / final)
            weight_map.update({n: final for n in names})
        if len(shards) > 1:
            (tmp / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
        (tmp / MARKER).write_text(json.dumps({"version": int(version), "tensors": count, "bytes": total}))

    return write_dir_atomic(out_dir, writer, kind="weights")   # slick.ckpt.output_dirs


def write_adapter_dir(out_dir, version: int, payload) -> Path:
    """Write a LoRA adapter (``slick.weights.lora_sync.AdapterPayload``) as a PEFT adapter directory
    (``adapter_config.json``, ``adapter_model.safetensors``) with the version marker (``"kind": "lora_adapter"``),
    atomically like :func:`write_weights_dir`; return its path."""
    from safetensors.torch import save_file

    def writer(tmp: Path) -> None:
        (tmp / "adapter_config.json").write_text(json.dumps(payload.config, indent=1))
        save_file({n: t.detach().to("cpu").contiguous() for n, t in payload.tensors.items()},
                  str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
        (tmp / MARKER).write_text(json.dumps({"version": int(version), "kind": "lora_adapter",
                                              "tensors": len(payload.tensors), "bytes": payload.nbytes}))

    return write_dir_atomic(out_dir, writer, kind="weights")


def read_marker(path) -> dict:
    """The version marker of a directory written by :func:`write_weights_dir`."""
    return json.loads((Path(path) / MARKER).read_text())


class DiskTransport:
    """``send`` writes ``disk_dir`` (module doc) and has every engine load it, all bounded by ``timeout_s``."""

    name = "disk"

    def __init__(self, disk_dir, *, bucket_bytes: int, timeout_s: float, model_dir: Optional[str] = None):
        self.disk_dir = Path(disk_dir)
        self.bucket_bytes = int(bucket_bytes)
        self.timeout_s = float(timeout_s)
        self.model_dir = model_dir
        self.engines: list = []
        self.last_bytes = 0          # tensor bytes written by the last send

    async def connect(self, engines: Sequence) -> None:
        self.engines = list(engines)

    async def send(self, version: int, named_tensors) -> None:
        import asyncio

        out = await bounded(asyncio.to_thread(write_weights_dir, self.disk_dir, version, named_tensors,
                                              self.bucket_bytes, self.model_dir),
                            self.timeout_s, f"writing weights version {version} to {self.disk_dir}")
        self.last_bytes = read_marker(out)["bytes"]
        await on_every_engine(self.engines, lambda e: e.update_weights(path=str(self.disk_dir), version=version),
                              self.timeout_s, f"loading {self.disk_dir} (version {version})")

    async def send_adapter(self, version: int, payload) -> None:
        """A LoRA adapter alone: ``disk_dir`` becomes a PEFT adapter directory (``slick.weights.lora_sync``) that every
        engine loads (merging it into its base, or serving it as vLLM's LoRA adapter)."""
        import asyncio

        await bounded(asyncio.to_thread(write_adapter_dir, self.disk_dir, version, payload),
                      self.timeout_s, f"writing adapter version {version} to {self.disk_dir}")
        self.last_bytes = payload.nbytes
        await on_every_engine(self.engines, lambda e: e.update_weights(path=str(self.disk_dir), version=version),
                              self.timeout_s, f"loading adapter {self.disk_dir} (version {version})")

    async def disconnect(self) -> None:
        self.engines = []
