"""Native kernels in tests: skip where they are not built, fail instead where CI requires them."""
import os

import pytest

# CI has a compiler: there (.ci/run sets SLICK_REQUIRE_NATIVE=1) missing kernels fail the tests instead of skipping
REQUIRE_NATIVE = os.environ.get("SLICK_REQUIRE_NATIVE", "0") == "1"


def require(kernels, what: str):
    """``kernels`` if built; else skip (or fail under SLICK_REQUIRE_NATIVE=1) naming ``what``."""
    if kernels is None:
        why = f"{what} not built (no C++ compiler, a failed build, or SLICK_NATIVE=0)"
        if REQUIRE_NATIVE:
            pytest.fail(f"{why}, and SLICK_REQUIRE_NATIVE=1 requires them")
        pytest.skip(why)
    return kernels
