"""Build and load slick's optional native CPU kernels: one C++ source file each, compiled on first use with the
system compiler and loaded with ctypes.

:func:`load_library` compiles ``source`` with ``$CXX`` (default ``c++``; ``-std=c++17 -O3 -march=native
-fopenmp``, plus the caller's flags) into ``$SLICK_CACHE/native`` (default ``~/.cache/slick/native``), keyed by
the source, the compiler's version, the CPU flags and the compiler flags, written to a temporary name and
renamed, and returns the loaded library. Where there is no compiler, the build fails, or ``SLICK_NATIVE=0``, it
returns ``None`` and the caller keeps its pure-torch path.
Users: the engine's decode kernels (``slick/engine/native.py``), the trainer's AdamW with bf16 moments
(``slick/train/native_adamw.py``) and its RMSNorm and logprob chunks (``slick/train/native_fused.py``).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Optional

log = logging.getLogger("slick")

_lock = threading.Lock()
_loaded: dict[tuple, Optional[ctypes.CDLL]] = {}


def cache_dir() -> Path:
    """Where built libraries live: ``$SLICK_CACHE/native`` or ``~/.cache/slick/native``."""
    root = os.environ.get("SLICK_CACHE") or str(Path.home() / ".cache" / "slick")
    return Path(root) / "native"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def build_library(source: Path, name: str, cc: str, march: str = "native", flags: tuple[str, ...] = ()) -> Path:
    """Compile ``source`` for ``-march=<march>`` with the extra compiler ``flags`` (unless cached) and return the
    library's path."""
    src = source.read_text()
    ver = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join((src, ver, _cpu_flags(), march, *flags)).encode()).hexdigest()[:16]
    out = cache_dir() / f"{name}-{key}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        cmd = [cc, "-std=c++17", "-O3", f"-march={march}", "-fopenmp", *flags, "-shared", "-fPIC", str(source), "-o",
               tmp]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def enabled() -> bool:
    """False when ``SLICK_NATIVE`` turns the native kernels off (0, false, no, off)."""
    return os.environ.get("SLICK_NATIVE", "1").lower() not in ("0", "false", "no", "off")


def load_library(source: Path, name: str, fallback: str, flags: tuple[str, ...] = ()) -> Optional[ctypes.CDLL]:
    """``source`` built (once per process and compiler, with the extra compiler ``flags``) and loaded, or None,
    logged once with ``fallback`` (what runs instead), where native kernels are off or cannot be built."""
    if not enabled():
        return None
    cc = os.environ.get("CXX") or "c++"
    with _lock:
        key = (str(source), cc)
        if key not in _loaded:
            _loaded[key] = None
            if shutil.which(cc) is None:
                log.info("no C++ compiler (%s) found: %s", cc, fallback)
            else:
                try:
                    _loaded[key] = ctypes.CDLL(str(build_library(source, name, cc, flags=flags)))
                except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                    log.warning("native kernels %s unavailable (%s): %s", name, e, fallback)
        return _loaded[key]
