"""Modules put on the path of the SGLang servers slick launches on a CPU (never on slick's own path).

This directory (not the package) goes first on a launched server's ``PYTHONPATH`` (slick/engines/sglang_launch.py):

* ``sgl_kernel``: the two functions SGLang 0.5.23's CPU mode imports at module level from ``sgl_kernel``, written in
  torch (PyPI's ``sgl-kernel`` is a CUDA build that does not import with the CPU torch);
* ``torchvision``: a stand-in with the two names SGLang's configs import eagerly (for the DeepSeek-OCR processor);
  anything else in it raises ImportError, so SGLang's text models run and an image model fails with a clear message
  (PyPI's torchvision is a CUDA build whose import fails with the CPU torch). docs/sglang.md.

Inside slick they are ``slick.engines.sglang_shim.sgl_kernel`` / ``...torchvision`` (tests/test_sglang_shim.py).
"""
from pathlib import Path

PATH = str(Path(__file__).resolve().parent)
