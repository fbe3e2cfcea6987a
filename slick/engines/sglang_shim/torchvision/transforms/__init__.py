"""``torchvision.transforms`` of the stand-in (see the package); ``InterpolationMode`` has torchvision's names."""
import enum

from torchvision._stand_in import module_getattr

__getattr__ = module_getattr(__name__)


class InterpolationMode(enum.Enum):
    """The names of torchvision's interpolation modes (nothing here interpolates)."""
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"
