"""reasoning-gym's procedural tasks: their items, generated reproducibly, and their own verifiers
(``--rm-type reasoning_gym``).

reasoning-gym (PyPI ``reasoning-gym``, ``pip install 'slick[envs]'``) has 100+ generators, each a
``ProceduralDataset`` whose item ``i`` is ``{"question", "answer", "metadata"}`` and whose ``score_answer(answer,
entry)`` is the task's verifier (a float in [0, 1]; partial credit where the task defines it).

**Reproducible by index.** Item ``i`` of a task is a function of (task, seed, size, config, i) only. slick asks the
generator for seed :func:`generator_seed` ``(task, seed)`` (a 32-bit mix of both, so the items of two seeds do not
overlap the way reasoning-gym's own ``Random(seed + i)`` would). Some generators iterate over Python sets, whose
order changes with the process's hash seed (``PYTHONHASHSEED``); so the items are generated in a child process with
``PYTHONHASHSEED=0`` and handed back pickled: a resumed run, another process or ``slick rescore`` gets the very same
items. They are kept in this process (:func:`items`), so scoring reads the item the prompt was made from.

**Scoring** (:func:`judge`): the answer is the content of the response's last ``<answer>...</answer>``
(``reasoning_gym.utils.extract_answer``, the format reasoning-gym's system prompts ask for; ``None`` when there is
none), scored by the task's ``score_answer`` with the item. The sample's ``metadata["reasoning_gym"]`` names the
item (``task``, ``seed``, ``size``, ``config``, ``index``); the label is the item's answer, checked against the
regenerated item (a mismatch is a :class:`~slick.reward.errors.LabelError`).

The ``reasoning-gym:TASK[,TASK...][?...]`` prompt spec is parsed here too (:func:`parse`, :func:`check`), below the
data and configure rooms that use it; slick/data/reasoning_gym.py turns a spec into prompt rows.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import parse_qsl

from slick.reward.errors import LabelError
from slick.reward.evidence import Judgement

RM_TYPE = "reasoning_gym"
META_KEY = "reasoning_gym"
ANSWER_TAG = "answer"
GENERATE_TIMEOUT = 600.0          # seconds the child process may take to generate a dataset's items
INSTALL = "pip install 'slick[envs]' (reasoning-gym==0.1.25)"
PREFIX = "reasoning-gym:"         # --prompt-data reasoning-gym:TASK[,TASK...][?size=N&seed=S&system=NAME&KEY=VALUE]
DEFAULT_SIZE = 1000
DEFAULT_SEED = 0

_ITEMS: dict[str, list] = {}      # key(task, seed, size, config) -> the task's items, as generated
_DATASETS: dict[str, Any] = {}    # the same key -> the ProceduralDataset whose score_answer scores them
_LOCK = threading.Lock()


class ReasoningGymError(ValueError):
    """reasoning-gym is missing, a task is unknown, or a generator failed."""


class ReasoningGymSpecError(ValueError):
    """A ``reasoning-gym:`` spec that cannot be used; the message names the spec and the problem."""


def require() -> Any:
    """The ``reasoning_gym`` module, or a :class:`ReasoningGymError` saying how to install it."""
    try:
        import reasoning_gym   # optional dependency: the envs extra
    except ImportError as e:
        raise ReasoningGymError(f"reasoning-gym is not installed ({e}): {INSTALL}") from None
    return reasoning_gym


def task_names() -> list[str]:
    """Every registered reasoning-gym task."""
    require()
    from reasoning_gym.factory import DATASETS   # optional dependency: the envs extra
    return sorted(DATASETS)


def generator_seed(task: str, seed: int) -> int:
    """The seed the task's generator gets for slick's ``seed``: a 32-bit mix of both."""
    return zlib.crc32(f"slick:{task}:{int(seed)}".encode())


def key(task: str, seed: int, size: int, config: Optional[dict] = None) -> str:
    return json.dumps([task, int(seed), int(size), config or {}], sort_keys=True)


def _make(task: str, seed: int, size: int, config: dict):
    rg = require()
    try:
        return rg.create_dataset(task, seed=generator_seed(task, seed), size=int(size), **(config or {}))
    except (TypeError, AssertionError, ValueError) as e:
        raise ReasoningGymError(f"reasoning-gym task {task!r} with {config or {}}: {type(e).__name__}: {e}") from None


def _generate_here(specs: list) -> list:
    """The items of each ``[task, seed, size, config]`` (in this process: the child's side)."""
    out = []
    for task, seed, size, config in specs:
        ds = _make(task, seed, size, config)
        out.append([ds[i] for i in range(int(size))])
    return out


def _generate(specs: list) -> list:
    """:func:`_generate_here` in a child process with ``PYTHONHASHSEED=0`` (module doc), items pickled back."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run([sys.executable, "-m", "slick.reward.reasoning_gym", json.dumps(specs)], env=env,
                          capture_output=True, timeout=GENERATE_TIMEOUT)
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ReasoningGymError(f"reasoning-gym generation failed: {err[-1] if err else f'exit {proc.returncode}'}")
    return pickle.loads(proc.stdout)   # our own child's output


def items(task: str, seed: int, size: int, config: Optional[dict] = None) -> list:
    """The ``size`` items of ``task`` for ``seed`` (generated once per process, module doc)."""
    return load([(task, seed, size, config or {})])[0]


def load(specs: list) -> list:
    """:func:`items` of several ``(task, seed, size, config)`` at once (one child process for all missing)."""
    require()
    with _LOCK:
        missing = [list(s) for s in specs if key(*s) not in _ITEMS]
        if missing:
            for s, got in zip(missing, _generate(missing)):
                _ITEMS[key(*s)] = got
        return [_ITEMS[key(*s)] for s in specs]


def dataset(task: str, seed: int, size: int, config: Optional[dict] = None):
    """The task's ``ProceduralDataset`` for this (seed, size, config): its ``score_answer`` scores the items."""
    k = key(task, seed, size, config)
    with _LOCK:
        if k not in _DATASETS:
            _DATASETS[k] = _make(task, seed, size, config or {})
        return _DATASETS[k]


# ---------------------------------------------------------------------- --prompt-data reasoning-gym:... specs
@dataclass
class ReasoningGymSpec:
    tasks: list
    size: int = DEFAULT_SIZE
    seed: int = DEFAULT_SEED
    system: str = "default"
    config: dict = field(default_factory=dict)


def is_spec(spec: Optional[str]) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse(spec: str) -> ReasoningGymSpec:
    """The tasks and options of a ``reasoning-gym:`` spec (module doc); problems raise
    :class:`ReasoningGymSpecError`. Task names are checked against reasoning-gym when it is installed."""
    body = spec[len(PREFIX):]
    names, _, query = body.partition("?")
    tasks = [t.strip() for t in names.split(",") if t.strip()]
    if not tasks:
        raise ReasoningGymSpecError(f"{spec}: no task (reasoning-gym:TASK[,TASK...][?size=N&seed=S])")
    if len(set(tasks)) != len(tasks):
        raise ReasoningGymSpecError(f"{spec}: a task is listed twice")
    out = ReasoningGymSpec(tasks)
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ReasoningGymSpecError(f"{spec}: bad options {query!r} (KEY=VALUE joined by &)") from None
    for k, v in pairs:
        if k in ("size", "seed"):
            try:
                setattr(out, k, int(v))
            except ValueError:
                raise ReasoningGymSpecError(f"{spec}: {k} must be an integer, got {v!r}") from None
        elif k == "system":
            out.system = v
        elif k in out.config:
            raise ReasoningGymSpecError(f"{spec}: option {k!r} given twice")
        else:
            out.config[k] = _value(v)
    if out.size < 1:
        raise ReasoningGymSpecError(f"{spec}: size must be >= 1, got {out.size}")
    if out.seed < 0:
        raise ReasoningGymSpecError(f"{spec}: seed must be >= 0, got {out.seed}")
    return out


def check(spec: str) -> None:
    """Start-up check (slick.configure.validate): the spec parses, reasoning-gym is installed, the tasks exist and
    the system prompt is known. Generates nothing."""
    s = parse(spec)
    try:
        known = task_names()
    except ReasoningGymError as e:
        raise ReasoningGymSpecError(f"{spec}: {e}") from None
    unknown = [t for t in s.tasks if t not in known]
    if unknown:
        raise ReasoningGymSpecError(f"{spec}: unknown reasoning-gym task(s) {', '.join(unknown)} "
                                    f"({len(known)} tasks, e.g. {', '.join(known[:5])}, ...)")
    systems = system_prompts()
    if s.system != "none" and s.system not in systems:
        raise ReasoningGymSpecError(f"{spec}: unknown system={s.system} (choose from none, {', '.join(systems)})")


def system_prompts() -> dict:
    require()
    from reasoning_gym.utils import SYSTEM_PROMPTS   # optional dependency: the envs extra
    return dict(SYSTEM_PROMPTS)


def extract(response: str) -> Optional[str]:
    """The content of the response's last ``<answer>...</answer>`` (stripped), or ``None``."""
    require()
    from reasoning_gym.utils import extract_answer   # optional dependency: the envs extra
    return extract_answer(response or "", tag_name=ANSWER_TAG)


def _where(label: Any, metadata: Optional[dict]) -> tuple:
    info = (metadata or {}).get(META_KEY)
    need = ("task", "seed", "size", "index")
    if not isinstance(info, dict) or any(k not in info for k in need):
        raise LabelError(f"{RM_TYPE} reward: metadata.{META_KEY} must name the item ({', '.join(need)}, config): "
                         f"rows come from --prompt-data reasoning-gym:TASK; got {str(info)[:80]!r}")
    config = info.get("config") or {}
    if not isinstance(config, dict) or not isinstance(info["index"], int) or not 0 <= info["index"] < info["size"]:
        raise LabelError(f"{RM_TYPE} reward: metadata.{META_KEY} is malformed: {str(info)[:120]!r}")
    return info["task"], int(info["seed"]), int(info["size"]), config, info["index"]


def judge(response: str, label: Any, metadata: Optional[dict] = None) -> Judgement:
    """The task's own ``score_answer`` on the last ``<answer>`` of the response (module doc)."""
    task, seed, size, config, index = _where(label, metadata)
    try:
        entry = items(task, seed, size, config)[index]
    except ReasoningGymError as e:
        raise LabelError(f"{RM_TYPE} reward: {e}") from None
    if label is not None and str(label) != str(entry["answer"]):
        raise LabelError(f"{RM_TYPE} reward: label {str(label)[:80]!r} is not the answer of {task} item {index} "
                         f"(seed {seed}) as generated here ({str(entry['answer'])[:80]!r})")
    answer = extract(response)
    score = dataset(task, seed, size, config).score_answer(answer, entry)
    score = float(score)
    return Judgement(score, answer, score >= 1.0, {"gold": str(entry["answer"]), "task": task, "index": index})


def score(response: str, label: Any, metadata: Optional[dict] = None) -> float:
    """The task's verifier score for the response (:func:`judge`)."""
    return judge(response, label, metadata).score


if __name__ == "__main__":   # the generating child process (:func:`_generate`)
    _out, sys.stdout = sys.stdout.buffer, sys.stderr   # what a generator prints must not mix with the items
    _out.write(pickle.dumps(_generate_here(json.loads(sys.argv[1]))))
