"""Process-wide random state: seeding (python, numpy, torch) and the states a checkpoint saves and restores.

``slick train`` calls :func:`seed_everything` once, when the run is built (``slick.loop.run.Run``); the
Trainer itself does not reseed.

:func:`rng_state` holds tensors and plain data only (numpy's key as an int64 tensor), so ``rng.pt`` loads
with ``torch.load(weights_only=True)`` (:func:`read_rng_file`). Files written before that format (numpy's
state as an ``ndarray``) still load: for them alone, numpy's array reconstruction is accepted as well.
"""
from __future__ import annotations

import random

import numpy as np
import torch

from slick.ckpt.safe_load import load_pt


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def _numpy_state() -> dict:
    name, key, pos, has_gauss, cached = np.random.get_state()
    return {"bit_generator": str(name), "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def rng_state() -> dict:
    """Python, numpy and torch (cpu + cuda) RNG states, as tensors and plain data."""
    st = {"python": random.getstate(), "numpy": _numpy_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    """Inverse of :func:`rng_state` (also takes the older layout: numpy's ``get_state()`` tuple)."""
    version, internal, gauss = st["python"]
    random.setstate((version, tuple(internal), gauss))
    npst = st["numpy"]
    if isinstance(npst, dict):
        key = npst["key"].numpy() if torch.is_tensor(npst["key"]) else np.asarray(npst["key"])
        npst = (npst["bit_generator"], key.astype(np.uint32), npst["pos"], npst["has_gauss"],
                npst["cached_gaussian"])
    np.random.set_state(npst)
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _legacy_numpy_globals() -> list:
    """What an ``rng.pt`` of the older layout needs beyond plain data: numpy's uint32 array reconstruction
    (under numpy 1's and numpy 2's module names)."""
    reconstruct = np.zeros(1).__reduce__()[0]
    return [reconstruct, (reconstruct, "numpy.core.multiarray._reconstruct"),
            (reconstruct, "numpy._core.multiarray._reconstruct"), np.ndarray, np.dtype,
            type(np.dtype(np.uint32))]


def save_rng_file(path) -> None:
    """Write this process's :func:`rng_state` to ``path``."""
    torch.save(rng_state(), path)


def read_rng_file(path) -> dict:
    """An ``rng.pt`` read with ``weights_only=True`` (:mod:`slick.ckpt.safe_load`); a file that holds anything
    else raises :class:`slick.ckpt.safe_load.UnsafeCheckpointError` naming it."""
    st = load_pt(path, safe_globals=_legacy_numpy_globals())
    if not isinstance(st, dict) or not {"python", "numpy", "torch"} <= set(st):
        raise ValueError(f"{path}: not an RNG state file (expected the keys python, numpy, torch)")
    return st
