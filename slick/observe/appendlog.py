"""Append-only line logs (``metrics.jsonl``) that a crash or a full disk cannot leave corrupt for the next writer.

Two rules keep every line either whole or absent:

* opening for append (a fresh run or a resumed one) first cuts a trailing partial line, the bytes after the
  last ``"\\n"`` (what a crash or a full disk mid-write leaves), and logs how many bytes it cut, so the next
  line never lands glued to half of an old one;
* each record goes out as one ``os.write`` of the whole line; when the write fails part-way (disk full, file
  size limit) the file is cut back to its length before the write and :class:`AppendLogError` names the file.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("slick")

_CHUNK = 1 << 16


class AppendLogError(OSError):
    """A line could not be appended (the message names the file); the file still ends with a whole line."""


def cut_partial_line(fd: int, path) -> int:
    """Truncate the file open as ``fd`` back to just after its last newline; returns the bytes cut (0 when the
    file is empty or already ends with ``"\\n"``)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    end = size
    keep = 0
    while end > 0:
        start = max(0, end - _CHUNK)
        nl = os.pread(fd, end - start, start).rfind(b"\n")
        if nl >= 0:
            keep = start + nl + 1
            break
        end = start
    os.ftruncate(fd, keep)
    cut = size - keep
    log.warning("%s: cut a partial last line of %d bytes (left by a crash or a full disk while it was written) "
                "before appending; the file now ends with its last complete line", path, cut)
    return cut


class AppendLog:
    """One append-only text file written a whole line at a time (see the module doc)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            self.cut_bytes = cut_partial_line(self._fd, self.path)
        except BaseException:
            os.close(self._fd)
            raise

    def write_line(self, line: str) -> None:
        """Append ``line`` (a newline is added when missing) with one ``os.write``; on failure the file is cut
        back to where it was and :class:`AppendLogError` is raised."""
        if self._fd < 0:
            raise AppendLogError(f"{self.path}: log is closed")
        data = (line if line.endswith("\n") else line + "\n").encode("utf-8")
        before = os.fstat(self._fd).st_size    # one writer: where this line starts
        try:
            done = os.write(self._fd, data)
            while done < len(data):             # a short write: the next call reports why (ENOSPC, EFBIG)
                done += os.write(self._fd, data[done:])
        except OSError as e:
            try:
                os.ftruncate(self._fd, before)
                state = "the file was cut back to its last complete line"
            except OSError:                     # the next open cuts the partial line instead
                state = "the partial line will be cut when the file is next opened"
            raise AppendLogError(e.errno, f"{self.path}: could not append a {len(data)}-byte line "
                                          f"({e.strerror or e}); {state}") from e

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
