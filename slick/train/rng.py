"""Process-wide random state: seeding (python, numpy, torch) and the states a checkpoint saves and restores.

``slick train`` calls :func:`seed_everything` once, when the run is built (``slick.loop.run.Run``); the
Trainer itself does not reseed.
"""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Python, numpy and torch (cpu + cuda) RNG states."""
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    """Inverse of :func:`rng_state`."""
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])
