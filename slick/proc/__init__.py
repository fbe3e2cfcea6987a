"""Process set-up, below every other room: child processes that die with the driver and the parent watch
(:mod:`.children`), the CPU allocator and oneDNN's cache (:mod:`.memory`, which ``slick.cli`` imports before its
tcmalloc re-exec), and torch.distributed process groups (:mod:`.dist`).

Import submodules directly; this package imports nothing.
"""
