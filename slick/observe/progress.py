"""Training progress on stderr: a tqdm bar (step/total, reward, last eval, tokens/s, ETA), or one line per
step when disabled (logs, CI)."""
from __future__ import annotations

import sys
import time
from typing import TextIO

REWARD_KEY = "rollout/raw_reward"
TPS_KEY = "perf/tokens_per_sec"


def _last_eval(metrics: dict) -> tuple[str, float] | None:
    """The first ``eval/<name>`` score (not a pass@k) in ``metrics``, as (name, value)."""
    for k in sorted(metrics):
        if k.startswith("eval/") and "-pass@" not in k:
            return k[len("eval/"):], float(metrics[k])
    return None


def _fmt_eta(seconds: float) -> str:
    s = int(round(max(seconds, 0.0)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    """Progress over ``total_steps`` training steps.

    ``update(step, metrics)`` takes the step just finished (1-based count or 0-based index: the bar is set
    to ``step`` if it moved forward, so pass the number of steps done) and the metrics dict logged for it;
    it reads ``rollout/raw_reward``, ``perf/tokens_per_sec`` and the latest ``eval/<name>``.
    With ``enabled=False`` each update prints one line such as
    ``step 3/10 | reward 0.625 | eval/addition 0.700 | 512 tok/s | eta 00:42``.
    """

    def __init__(self, total_steps: int, enabled: bool = True, *, file: TextIO | None = None,
                 desc: str = "train", initial: int = 0):
        self.total = int(total_steps)
        self.enabled = enabled
        self.file = file if file is not None else sys.stderr
        self.step = int(initial)
        self._start_step = int(initial)
        self._t0 = time.monotonic()
        self._eval: tuple[str, float] | None = None
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, initial=self.step, desc=desc, file=self.file,
                             dynamic_ncols=True, unit="step", leave=True)

    def fields(self, metrics: dict) -> dict[str, str]:
        """Short display fields picked from ``metrics`` (reward, eval, tok/s); updates the last eval seen."""
        out: dict[str, str] = {}
        if REWARD_KEY in metrics:
            out["reward"] = f"{float(metrics[REWARD_KEY]):.3f}"
        ev = _last_eval(metrics)
        if ev is not None:
            self._eval = ev
        if self._eval is not None:
            out[f"eval/{self._eval[0]}"] = f"{self._eval[1]:.3f}"
        if TPS_KEY in metrics:
            out["tok/s"] = f"{float(metrics[TPS_KEY]):.0f}"
        return out

    def eta_seconds(self) -> float | None:
        """Seconds left at the mean pace of the steps done since start (None before the first step)."""
        done = self.step - self._start_step
        if done <= 0:
            return None
        return (time.monotonic() - self._t0) / done * max(self.total - self.step, 0)

    def update(self, step: int, metrics: dict | None = None) -> None:
        """Mark ``step`` steps done and show the fields of ``metrics``."""
        metrics = metrics or {}
        fields = self.fields(metrics)
        step = int(step)
        if self._bar is not None:
            if step > self.step:
                self._bar.update(step - self.step)
            self.step = max(self.step, step)
            self._bar.set_postfix(fields, refresh=True)
            return
        self.step = max(self.step, step)
        parts = [f"step {self.step}/{self.total}"]
        parts += [f"{k} {v}" if k != "tok/s" else f"{v} tok/s" for k, v in fields.items()]
        eta = self.eta_seconds()
        if eta is not None:
            parts.append(f"eta {_fmt_eta(eta)}")
        print(" | ".join(parts), file=self.file, flush=True)

    def write(self, msg: str) -> None:
        """Print ``msg`` on its own line above the bar (or plainly when disabled)."""
        if self._bar is not None:
            self._bar.write(msg, file=self.file)
        else:
            print(msg, file=self.file, flush=True)

    def close(self) -> None:
        """Finish the bar (idempotent)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
