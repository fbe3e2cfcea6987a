"""``--trace-file``: the run's timeline (slick/rollout/timeline.py) as a Chrome / Perfetto trace.

The file is the JSON object format of the Trace Event Format: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``
with complete events (``"ph": "X"``, microseconds) and instant events (``"ph": "i"``). Tracks become threads of
three processes: *run* (the engine's busy spans, the trainer's steps), *groups* (each group in flight, then
buffered) and *samples* (each sample's generate, tool and reward spans). Open it in ui.perfetto.dev or
chrome://tracing; ``slick inspect`` links it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

PROCESSES = {"run": 1, "group": 2, "sample": 3}


def trace_path(trace_file: Optional[str], run_dir) -> Optional[Path]:
    """Where ``--trace-file`` writes: the path itself, or under the run directory when relative."""
    if not trace_file:
        return None
    path = Path(trace_file)
    return path if path.is_absolute() else Path(run_dir) / path


def _thread(track: str, tids: dict) -> tuple[int, int]:
    kind = track.split(" ", 1)[0]
    pid = PROCESSES.get(kind, PROCESSES["run"])
    key = (pid, track)
    if key not in tids:
        tids[key] = len([k for k in tids if k[0] == pid]) + 1
    return pid, tids[key]


def trace_events(spans: list[dict]) -> list[dict]:
    """Chrome trace events for the timeline's spans (``Timeline.events()``), with process and thread names."""
    tids: dict = {}
    out = []
    for e in spans:
        pid, tid = _thread(e["track"], tids)
        ev = {"name": e["name"], "cat": e["track"].split(" ", 1)[0], "pid": pid, "tid": tid,
              "ts": round(e["ts"] * 1e6, 1), "args": e.get("args") or {}}
        if e["dur"] is None:
            ev.update(ph="i", s="t")
        else:
            ev.update(ph="X", dur=round(e["dur"] * 1e6, 1))
        out.append(ev)
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}
            for name, pid in PROCESSES.items()]
    meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": track}}
             for (pid, track), tid in tids.items()]
    return meta + sorted(out, key=lambda ev: ev["ts"])


def write_trace(path: Path, spans: list[dict], metadata: Optional[dict] = None) -> Path:
    """Write the trace atomically (a reader never sees half a file); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    body = {"traceEvents": trace_events(spans), "displayTimeUnit": "ms", "otherData": metadata or {}}
    tmp.write_text(json.dumps(body), encoding="utf-8")
    os.replace(tmp, path)
    return path
