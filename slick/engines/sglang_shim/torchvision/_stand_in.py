"""The placeholders of the torchvision stand-in (see the package)."""
import importlib.abc
import importlib.machinery
import sys

STAND_IN = ("torchvision is a stand-in on this SGLang server (slick/engines/sglang_shim): image models need a "
            "torchvision built for this torch")


class _Missing:
    """A name the stand-in does not have: using it raises ImportError naming it."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __call__(self, *a, **kw):
        raise ImportError(f"{self._name}: {STAND_IN}")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise ImportError(f"{self._name}.{attr}: {STAND_IN}")

    def __repr__(self) -> str:
        return f"<stand-in for {self._name}>"


def module_getattr(module: str):
    """A module ``__getattr__`` that answers every public name with a placeholder."""
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{module}.{name}")
    return __getattr__


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``torchvision.X`` without a file here is an empty package whose names are placeholders."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("torchvision."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = module_getattr(module.__name__)


def install() -> None:
    """Put the finder last on ``sys.meta_path`` (the stand-in's own files are found first)."""
    if not any(isinstance(f, _Submodules) for f in sys.meta_path):
        sys.meta_path.append(_Submodules())
