"""A test process killed while its Ray head runs (SIGKILL: no teardown at all) leaves no Ray process behind:
the reaper tests/ray_head.py starts with the head ends the cluster and removes its temp dir."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ray_head import _alive, _pids_matching

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
HOLDER = """
import sys, time
from tests.ray_head import RayHead
h = RayHead(num_cpus=1).start()
print(h.temp_dir, h.gcs_address, h.reaper.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_test_process_leaves_no_ray_process():
    pytest.importorskip("ray")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    temp_dir = gcs = None
    try:
        line = holder.stdout.readline()          # bounded by RayHead's own 90 s start-up timeout
        assert line, f"the holder exited ({holder.wait(timeout=30)}) before its Ray head was ready"
        temp_dir, gcs, reaper = line.split()
        assert len(_pids_matching([temp_dir, gcs])) >= 2            # ray start, raylet, GCS, ...
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (_pids_matching([temp_dir, gcs]) or Path(temp_dir).exists()):
            time.sleep(0.5)
        assert _pids_matching([temp_dir, gcs]) == [] and not Path(temp_dir).exists()
        assert not _alive(int(reaper))                              # the reaper is done too
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
        if temp_dir:          # what the reaper did not end (the assertion above has failed then)
            for pid in _pids_matching([temp_dir, gcs]):
                os.kill(pid, signal.SIGKILL)
