"""The sandbox's seccomp filter: the system calls that would let a program hold memory outside its limits.

RLIMIT_AS counts only what a process has mapped, so memory a program can park in the kernel and unmap is not
counted by it: SysV shared memory segments (``shmget``, which outlive the process that made them), SysV
semaphore arrays and message queues (``semget``, ``msgget``), POSIX message queues (``mq_open``) and anonymous
in-memory files (``memfd_create``, ``memfd_secret``). The filter makes these calls fail with EPERM; a system
call of another ABI than the machine's own (x86's 32-bit ``int 0x80`` or x32 numbers, which would get around
a filter written for 64-bit numbers) ends the process (SIGSYS). POSIX shared memory (``shm_open``,
``multiprocessing.shared_memory``) still works: ``/dev/shm`` is the program's own ``/tmp``, of
``--sandbox-tmp-mb``.

:func:`program` is the classic-BPF program bubblewrap loads with ``--seccomp FD`` (raw ``struct sock_filter``
entries in native byte order); ``None`` on a machine other than x86_64 and aarch64 (no filter there).
"""
from __future__ import annotations

import errno
import platform
import struct
from typing import Optional

# BPF opcodes (linux/filter.h, linux/seccomp.h)
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
NR_OFFSET, ARCH_OFFSET = 0, 4             # struct seccomp_data: int nr; __u32 arch; ...
X32_BIT = 0x40000000

# machine -> (AUDIT_ARCH_*, {system call: number}, whether x32 numbers must be refused)
ARCHES = {
    "x86_64": (0xC000003E, {"shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240, "memfd_create": 319,
                            "memfd_secret": 447}, True),
    "aarch64": (0xC00000B7, {"mq_open": 180, "msgget": 186, "semget": 190, "shmget": 194, "memfd_create": 279,
                             "memfd_secret": 447}, False),
}
ARCHES["amd64"] = ARCHES["x86_64"]
ARCHES["arm64"] = ARCHES["aarch64"]
BLOCKED = ("shmget", "semget", "msgget", "mq_open", "memfd_create", "memfd_secret")


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: Optional[str] = None) -> Optional[bytes]:
    """The filter for ``machine`` (default: this one's, ``platform.machine()``), or None when unknown."""
    arch = ARCHES.get((machine or platform.machine()).lower())
    if arch is None:
        return None
    audit, numbers, x32 = arch
    nrs = [numbers[name] for name in BLOCKED]
    # 0: load arch; 1: foreign ABI -> kill; 2: load nr; [x32 check]; one jeq per number; allow; deny
    body = [_op(LD_W_ABS, ARCH_OFFSET)]
    checks = len(nrs) + (1 if x32 else 0)
    body.append(_op(JEQ_K, audit, 0, checks + 3))               # jump to the kill at the very end
    body.append(_op(LD_W_ABS, NR_OFFSET))
    if x32:
        body.append(_op(JGE_K, X32_BIT, checks, 0))             # -> deny (EPERM)
    for i, nr in enumerate(nrs):
        body.append(_op(JEQ_K, nr, len(nrs) - i, 0))            # -> deny
    body.append(_op(RET_K, RET_ALLOW))
    body.append(_op(RET_K, RET_ERRNO | errno.EPERM))
    body.append(_op(RET_K, RET_KILL_PROCESS))
    return b"".join(body)
