"""Debug dumps: rollouts (save / load to skip generation) and per-step train data."""
from __future__ import annotations

import json
from pathlib import Path

from slick.types import Sample


def _write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    tmp.replace(path)


def save_rollout(directory: str, step: int, groups: list[list[Sample]]) -> Path:
    path = Path(directory) / f"rollout_{step}.jsonl"
    _write_jsonl(path, (s.to_dict() for g in groups for s in g))
    return path


def load_rollout(directory: str, step: int) -> list[list[Sample]]:
    """Read back a rollout saved by ``save_rollout``, regrouped by group_index (order kept)."""
    path = Path(directory) / f"rollout_{step}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"--load-debug-rollout-data: {path} not found (saved steps: "
                                f"{sorted(p.name for p in Path(directory).glob('rollout_*.jsonl'))})")
    groups: dict[int, list[Sample]] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            s = Sample.from_dict(json.loads(line))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}:{lineno}: not a saved sample ({e})") from None
        groups.setdefault(s.group_index, []).append(s)
    return list(groups.values())


def save_train_data(directory: str, step: int, batch, logprobs) -> Path:
    """DIR/train_{step}.jsonl: one line per sample of ``batch`` (a ``slick.algo.batch.TrainBatch``) with raw
    reward, advantages and logprobs per token, the policy version of each response token, the trainer's version at
    the sample's optimizer step, its epoch."""
    def tolist(x, i):
        return None if x is None else [round(float(v), 6) for v in x[i]]

    rows = []
    for i, s in enumerate(batch.samples):
        row = {"index": s.index, "group_index": s.group_index, "prompt_index": s.prompt_index, "epoch": s.epoch,
               "response_ids": list(s.response_ids), "weight_versions": list(s.weight_versions),
               "train_version": batch.versions[i],
               "reward": batch.rewards[i], "advantages": tolist(batch.advantages, i),
               "loss_mask": list(s.loss_mask), "rollout_logprobs": list(s.rollout_logprobs),
               "logprobs": tolist(logprobs, i)}
        if batch.ref_logprobs is not None:
            row["ref_logprobs"] = tolist(batch.ref_logprobs, i)
        rows.append(row)
    path = Path(directory) / f"train_{step}.jsonl"
    _write_jsonl(path, rows)
    return path
