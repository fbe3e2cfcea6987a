"""slick.proc.memory: the allocator settings a CPU run applies, checked in fresh processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# a training thread (not the main one) allocates, touches and frees a 48 MiB tensor 8 times
_LOOP = """
import json, resource, sys, threading
from slick.proc.memory import tune_cpu_allocator as t
on = [t(), t()]
import torch
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096
def work(out):
    for _ in range(8):
        f0, r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, rss()
        x = torch.empty(12 * 2**20); x.fill_(1.0); del x
        out.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, rss() - r0))
out = []
th = threading.Thread(target=work, args=(out,)); th.start(); th.join()
print(json.dumps({"on": on, "faults": [f for f, _ in out], "growth": [g for _, g in out]}), flush=True)
import ctypes; ctypes.CDLL("libc.so.6").malloc_stats()   # one "Arena N:" block per arena, on stderr
"""


def _run(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SLICK_TUNE_ALLOCATOR", "THP_MEM_ALLOC_ENABLE",
                                                             "MALLOC_ARENA_MAX")}
    out = subprocess.run([sys.executable, "-c", _LOOP], capture_output=True, text=True, timeout=120,
                         env={**env, **env_extra})
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["arenas"] = sum(line.startswith("Arena ") for line in out.stderr.splitlines())
    return r


def test_one_arena_and_huge_pages_and_memory_is_returned():
    """With the settings the training thread allocates from the one (main) arena, and each iteration's fresh
    48 MiB costs at most ~600 faults (2 MiB pages, plus the 4 KiB pages of an unaligned edge); without them
    (glibc's and torch's defaults) the thread gets an arena of its own and pays one fault per 4 KiB: 12,288.
    Freed memory goes back to the OS either way: RSS does not grow from one iteration to the next."""
    on = _run({})
    assert on["on"] == [True, True]
    assert on["arenas"] == 1, on
    assert max(on["faults"]) < 1_000, on
    assert on["growth"][1:] == [0] * 7, on
    off = _run({"SLICK_TUNE_ALLOCATOR": "0"})
    assert off["on"] == [False, False]
    assert off["arenas"] >= 2, off
    assert min(off["faults"]) >= 12_000, off
    assert max(off["growth"][1:]) <= 1 << 20, off   # (a stray heap page or two)


def test_a_user_setting_for_huge_pages_is_kept():
    r = _run({"THP_MEM_ALLOC_ENABLE": "0"})
    assert r["on"] == [True, True]
    assert min(r["faults"]) >= 12_000, r



# tcmalloc: CI installs it (`make tcmalloc`) and sets SLICK_REQUIRE_TCMALLOC=1, so these tests run there
from slick.proc.memory import find_tcmalloc  # noqa: E402

REQUIRE_TCMALLOC = os.environ.get("SLICK_REQUIRE_TCMALLOC", "0") == "1"
_PRELOAD = """
import json, os, sys
from slick.proc.memory import AllocatorError, tcmalloc_loaded, tune_cpu_allocator, use_tcmalloc
try:
    use_tcmalloc()
except AllocatorError as e:
    print(json.dumps({"error": str(e)})); sys.exit(0)
import torch
x = torch.ones(1 << 20); del x
print(json.dumps({"pid": os.getpid(), "tcmalloc": tcmalloc_loaded(), "preload": os.environ.get("LD_PRELOAD", ""),
                  "tuned": tune_cpu_allocator(), "huge_pages_env": os.environ.get("THP_MEM_ALLOC_ENABLE")}))
"""


def _preload(tmp_path, **env_extra) -> dict:
    script = tmp_path / "preload.py"
    script.write_text(_PRELOAD)
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLICK_ALLOCATOR", "SLICK_TCMALLOC_PRELOADED", "LD_PRELOAD", "THP_MEM_ALLOC_ENABLE")}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**env, **env_extra})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    r = json.loads(out.strip().splitlines()[-1])
    r["popen_pid"] = proc.pid
    return r


def _need_tcmalloc():
    if find_tcmalloc() is None:
        if REQUIRE_TCMALLOC:
            pytest.fail("no libtcmalloc is installed, and SLICK_REQUIRE_TCMALLOC=1 requires it (make tcmalloc)")
        pytest.skip("libtcmalloc is not installed (make tcmalloc)")


def test_entry_points_re_execute_themselves_with_tcmalloc(tmp_path):
    """`auto` (the default): the same process (same pid) runs on with tcmalloc preloaded, and the glibc
    settings are left alone; `glibc`: nothing changes; an unknown value and a preload that did not load are
    refused by name."""
    _need_tcmalloc()
    on = _preload(tmp_path)
    assert on["tcmalloc"] is True and on["pid"] == on["popen_pid"], on
    assert on["preload"].split()[0] == find_tcmalloc(), on
    assert on["tuned"] is False and on["huge_pages_env"] is None, on
    assert _preload(tmp_path, SLICK_ALLOCATOR="tcmalloc")["tcmalloc"] is True
    off = _preload(tmp_path, SLICK_ALLOCATOR="glibc")
    assert off["tcmalloc"] is False and off["preload"] == "" and off["tuned"] is True, off
    assert off["huge_pages_env"] == "1", off
    bad = _preload(tmp_path, SLICK_ALLOCATOR="jemalloc")
    assert bad == {"error": "SLICK_ALLOCATOR='jemalloc': expected one of auto, tcmalloc, glibc",
                   "popen_pid": bad["popen_pid"]}
    # a preload that was tried and did not take: `auto` goes on with glibc, `tcmalloc` says what failed
    assert _preload(tmp_path, SLICK_TCMALLOC_PRELOADED="1")["tcmalloc"] is False
    failed = _preload(tmp_path, SLICK_ALLOCATOR="tcmalloc", SLICK_TCMALLOC_PRELOADED="1")
    assert failed["error"] == "SLICK_ALLOCATOR=tcmalloc: LD_PRELOAD='' did not load it", failed


def test_own_memory_moves_memory_mapped_weights_into_the_process(tiny_model_dir):
    """safetensors' weights loaded in their own dtype are views of the file's memory map; own_memory copies exactly
    those (values and ties kept), and the trainer's trained weights are its own."""
    import torch
    from transformers import AutoModelForCausalLM

    from slick.proc.memory import own_memory
    from slick.train.trainer import Trainer
    from tests.test_train import make_cfg

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    params = list(model.parameters())
    mapped = [p for p in params if not p.untyped_storage().resizable()]
    assert mapped, "the tiny model's fp32 safetensors should load memory-mapped"
    before = [p.detach().clone() for p in params]
    assert own_memory(params) == sum(p.numel() * 4 for p in mapped)
    assert all(p.untyped_storage().resizable() for p in params)
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert model.lm_head.weight is model.model.embed_tokens.weight or not model.config.tie_word_embeddings
    assert own_memory(params) == 0
    tr = Trainer(make_cfg(tiny_model_dir, dtype="fp32"))
    assert all(p.untyped_storage().resizable() for p in tr.master)
