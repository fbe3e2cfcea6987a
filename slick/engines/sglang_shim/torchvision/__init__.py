"""A stand-in for torchvision on launched SGLang servers' path (slick/engines/sglang_shim; docs/sglang.md).

SGLang 0.5.23 imports ``torchvision.transforms`` when its configs load (for the DeepSeek-OCR processor), and
Transformers, seeing a torchvision, imports ``torchvision.io`` and ``torchvision.transforms.v2``. PyPI's torchvision
is a CUDA build whose import fails with the CPU torch. In this stand-in every ``torchvision.*`` module imports, and
every name in it but ``transforms.InterpolationMode`` is a placeholder that raises ImportError when it is used
(called, or an attribute read): text models load and serve, an image model fails naming the stand-in."""
from torchvision._stand_in import STAND_IN, install, module_getattr

__version__ = "0.0.0+slick-stand-in"
__getattr__ = module_getattr(__name__)
__all__ = ["STAND_IN"]
install()
