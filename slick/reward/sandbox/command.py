"""The bubblewrap command line of one sandboxed program, and where its parts come from.

The sandbox (``bwrap``, Debian's ``bubblewrap``) gets new user, PID, network, IPC, UTS and cgroup namespaces
(``--unshare-all``: no network but its own loopback), a new session, no capabilities, and is killed when the
process that started it dies (``--die-with-parent``). Its file system holds only:

- ``/usr`` (and the ``/bin``, ``/lib``... links or directories of the host) read-only: the interpreter and
  its standard library; the interpreter's own prefix too, read-only, when it lives elsewhere;
- ``/sandbox`` read-only: the program (``main.py``) in a fresh host directory made for this program only;
- ``/tmp``: a fresh in-memory file system of ``Limits.tmp_mb``, its working directory and ``HOME``: the only
  place it can write;
- a read-only ``/dev`` holding ``null``, ``zero``, ``full``, ``random``, ``urandom``, the ``fd``/``stdin``/
  ``stdout``/``stderr`` links and ``shm``, a link to ``/tmp`` (so POSIX shared memory shares ``/tmp``'s size);
- a ``/proc`` of its own PID namespace;
- a read-only root: nothing else can be created.

No ``/etc``, ``/home``, ``/root``, run directory or checkpoint is visible. Inside, a tiny launcher (the
interpreter with ``-I -S``) sets the rlimits of :class:`~slick.reward.sandbox.limits.Limits` (soft = hard, so
they cannot be raised again) and then ``exec``s ``python -I /sandbox/main.py``. When slick runs as root, the
sandbox runs as the unprivileged user ``nobody`` (65534) instead, so that RLIMIT_NPROC applies (the kernel
does not enforce it for root) and root-owned files stay closed to it. A seccomp filter
(:mod:`slick.reward.sandbox.seccomp`) refuses the system calls that hold memory outside the rlimits, and with
``--block-fd`` the sandbox waits, before running anything, until the pool has moved it into its memory cgroup
(:mod:`slick.reward.sandbox.cgroup`).
"""
from __future__ import annotations

import os
import shutil
import sys
from typing import Optional

from slick.reward.sandbox.limits import Limits

NOBODY = 65534
INSTALL_HINT = ("install it with `sudo apt-get install bubblewrap` (Debian/Ubuntu; `make sandbox` does this), "
                "`sudo dnf install bubblewrap` (Fedora) or your distribution's `bubblewrap` package")
TOP_LEVEL = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
PROGRAM = "/sandbox/main.py"
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
       "LC_ALL": "C.UTF-8"}

# runs inside the sandbox as `python -I -S -c LAUNCHER NAME=SOFT:HARD ... -- PYTHON -I PROGRAM`
LAUNCHER = """\
import os, resource, sys
sep = sys.argv.index("--")
for item in sys.argv[1:sep]:
    name, _, value = item.partition("=")
    soft, _, hard = value.partition(":")
    resource.setrlimit(getattr(resource, name), (int(soft), int(hard)))
os.execv(sys.argv[sep + 1], sys.argv[sep + 1:])
"""


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create a sandbox on this machine; the message says what to do."""


def find_bwrap(path: Optional[str] = None) -> str:
    """The ``bwrap`` binary (``path``, else the one on PATH); :class:`SandboxUnavailable` naming it when absent."""
    found = shutil.which(path or "bwrap")
    if found is None:
        where = f"at {path!r}" if path else "on PATH"
        raise SandboxUnavailable(f"the code sandbox needs the `bwrap` binary (bubblewrap), not found {where}; "
                                 f"{INSTALL_HINT}")
    return found


def default_python() -> str:
    """The interpreter programs run with: the system's ``/usr/bin/python3`` when present, else this one's."""
    if os.path.exists("/usr/bin/python3"):
        return "/usr/bin/python3"
    return os.path.realpath(sys.executable)


def _system_mounts() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in TOP_LEVEL:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _python_mounts(python: str) -> list[str]:
    """A read-only bind of the interpreter's prefix when it is not under /usr (pyenv, conda, ...)."""
    real = os.path.realpath(python)
    if real.startswith("/usr/") or any(real.startswith(t + "/") for t in TOP_LEVEL):
        return []
    prefix = os.path.dirname(os.path.dirname(real))       # PREFIX/bin/python3.X -> PREFIX
    return ["--ro-bind", prefix, prefix]


DEV_NODES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = (("/proc/self/fd", "/dev/fd"), ("/proc/self/fd/0", "/dev/stdin"), ("/proc/self/fd/1", "/dev/stdout"),
             ("/proc/self/fd/2", "/dev/stderr"), ("/tmp", "/dev/shm"))
DEV_SIZE = 1 << 16          # /dev's own tmpfs holds only the mount points and links above, then is read-only


def _dev_mounts() -> list[str]:
    """A small /dev (module doc); bwrap's ``--dev`` would add a size-less, writable /dev and /dev/shm."""
    args = ["--size", str(DEV_SIZE), "--tmpfs", "/dev"]
    for node in DEV_NODES:
        args += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
    for target, link in DEV_LINKS:
        args += ["--symlink", target, link]
    return args + ["--remount-ro", "/dev"]


def bwrap_argv(bwrap: str, python: str, program_dir: str, limits: Limits, status_fd: int,
               seccomp_fd: Optional[int] = None, block_fd: Optional[int] = None) -> list[str]:
    """The whole command line: bwrap's options, the launcher and the program (module doc). ``seccomp_fd``:
    a readable fd holding the filter; ``block_fd``: the sandbox starts its program once a byte arrives there."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "sandbox"]
    if os.geteuid() == 0:
        argv += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    argv += _system_mounts() + _python_mounts(python)
    argv += ["--proc", "/proc", *_dev_mounts(), "--size", str(int(limits.tmp_mb) << 20), "--tmpfs", "/tmp",
             "--ro-bind", program_dir, "/sandbox", "--remount-ro", "/", "--chdir", "/tmp",
             "--json-status-fd", str(status_fd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if block_fd is not None:
        argv += ["--block-fd", str(block_fd)]
    rl = [f"{name}={soft}:{hard}" for name, (soft, hard) in limits.rlimits().items()]
    return argv + ["--", python, "-I", "-S", "-c", LAUNCHER, *rl, "--", python, "-I", PROGRAM]


def run_as() -> dict:
    """``subprocess.Popen`` keywords that drop root to ``nobody`` before bwrap starts (nothing otherwise)."""
    if os.geteuid() != 0:
        return {}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}
