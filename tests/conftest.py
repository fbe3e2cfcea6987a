"""Shared fixtures: tiny random models built once per session."""
import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer Llama with SmolLM2's tokenizer, random weights (seed 0)."""
    from slick.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """One `slick serve` worker (fp32) on the tiny model, shared by a module's tests and stopped after them (a module
    that defines its own ``server`` fixture uses that one)."""
    from slick.engines.router import launch_workers

    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240)
    yield w
    w.stop()


@pytest.fixture(scope="session")
def smollm2_dir():
    """The real SmolLM2-135M-Instruct, prepared from the installed wheel (cached)."""
    from slick.models.smollm2 import prepare_smollm2

    return prepare_smollm2()
