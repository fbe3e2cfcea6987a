"""``--environment verifiers:ENV_ID``: a ``verifiers`` (0.4.0, ``verifiers.v1``) environment through slick's
token-exact multi-turn rollout.

verifiers 0.4.0 splits an environment into a **taskset** (``vf.Taskset.load()`` yields ``vf.Task`` objects whose
``data`` holds the prompt; the task's ``@vf.reward`` methods and plugged reward functions are its rubric, run by
``Task.score(trace)``) and an **env** (``vf.Env.run(task, agents)``: how the agents' turns go; a plain taskset gets
``SingleAgentEnv``, one reply). ``ENV_ID`` is what verifiers loads by id: an importable module (or an installed
environment package) exporting its ``Taskset`` subclass, and optionally its ``Env`` subclass, in ``__all__``
(``vf.load_taskset``, ``vf.environment_class``; nothing is downloaded).

* **Prompts** (``--prompt-data verifiers:ENV_ID?size=N&seed=S``): tasks ``S .. S+N-1`` of the taskset, each the
  task's system prompt and prompt as chat messages, ``metadata["verifiers"] = {"env", "idx"}``.
* **Turns**: the env's own ``run(task, agents)`` runs as the episode, with slick's policy in its one agent seat: each
  ``interaction.turn(message)`` the env makes appends ``message`` as a user observation (loss mask 0) and waits for
  the policy's next turn, which comes back to the env as the segment's ``last_reply``; the env returning ends the
  episode (``Segment(terminated=True)`` answers a turn asked after the end, as in verifiers). A turn the env asks
  past ``--max-turns`` or the token budget gets a terminated segment.
* **Reward** (``--custom-rm-path slick.rollout.envs.verifiers.rubric_reward``): a ``vf.Trace`` of the conversation
  (the assistant turns as sampled messages) with the rewards the env recorded during ``run``, scored by
  ``Task.score(trace)``; the sample's reward is ``trace.reward`` (the weighted sum). A rubric that raises fails the
  sample with ``--rm-failure-reward`` (the reward hub's failure path).

Not supported: multi-seat envs (several agents), prompt-less tasks (the env opens the conversation), tasks that
need a runtime (container) or tool servers (their ``toolsets``), and ``Env.finalize`` (cross-agent judgement).
"""
from __future__ import annotations

import asyncio
import functools
from contextlib import asynccontextmanager
from typing import Any, Optional

from slick.rollout.envs.spec import INSTALL, EnvSpec, EnvSpecError

META_KEY = "verifiers"
RUN_REWARDS = "run_rewards"     # metadata["verifiers"]: rewards the env recorded during run(), {name: [score, w]}
CLOSE_TIMEOUT = 30.0            # seconds an env's run() may take to end after the episode


def _vf():
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise EnvSpecError(f"verifiers:...: verifiers is not installed ({e}): {INSTALL}") from None
    return vf


class Loaded:
    """One environment id loaded once per process: its taskset, env class and env, tasks by index."""

    def __init__(self, env_id: str):
        vf = _vf()
        self.id = env_id
        try:
            self.taskset_config = vf.taskset_config_type(env_id)(id=env_id)
            self.taskset = vf.load_taskset(self.taskset_config)
            self.env_cls = vf.environment_class(env_id)
            self.env = self.env_cls(vf.env_config_type(env_id)(taskset=self.taskset_config))
        except (ImportError, TypeError, AttributeError, ValueError) as e:
            raise EnvSpecError(f"verifiers:{env_id}: {type(e).__name__}: {e}") from None
        seats = list(getattr(self.env, "_agent_specs", {}) or {})
        if len(seats) != 1:
            raise EnvSpecError(f"verifiers:{env_id}: {type(self.env).__name__} has {len(seats)} agent seats "
                               f"({seats}); slick's policy takes exactly one")
        self.seat = seats[0]
        self._tasks: list = []
        self._iter = iter(self.taskset)

    def task(self, idx: int):
        while len(self._tasks) <= idx:
            try:
                self._tasks.append(next(self._iter))
            except StopIteration:
                raise EnvSpecError(f"verifiers:{self.id}: no task {idx} (the taskset has {len(self._tasks)})") \
                    from None
        return self._tasks[idx]


@functools.lru_cache(maxsize=None)
def load(env_id: str) -> Loaded:
    return Loaded(env_id)


def _text(content: Any) -> str:
    return _vf().types.content_text(content) if not isinstance(content, str) else content


def prompt_messages(task) -> list[dict]:
    """A task's opening chat: its system prompt, then its prompt (a string is one user message)."""
    data = task.data
    msgs = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        msgs.append({"role": "user", "content": data.prompt})
    else:
        for m in data.prompt or []:
            m = m.model_dump() if hasattr(m, "model_dump") else dict(m)
            msgs.append({"role": m["role"], "content": _text(m.get("content"))})
    return msgs


def check(spec: EnvSpec) -> None:
    loaded = load(spec.id)
    first = loaded.task(spec.seed)
    if first.data.prompt is None:
        raise EnvSpecError(f"verifiers:{spec.id}: its tasks have no prompt (the env opens the conversation), "
                           f"which slick does not support yet")


def prompt_rows(spec: EnvSpec) -> tuple[list, list]:
    check(spec)
    loaded = load(spec.id)
    rows, where = [], []
    for i in range(spec.size):
        task = loaded.task(spec.seed + i)
        rows.append({"prompt_index": i, "prompt": prompt_messages(task), "label": None,
                     "metadata": {META_KEY: {"env": spec.id, "idx": spec.seed + i}}, "tools": None})
        where.append(f"{spec.name} task {spec.seed + i}")
    return rows, where


def new_trace(task, messages: list[dict]):
    """A ``vf.Trace`` of ``task`` holding ``messages`` (assistant ones as sampled turns)."""
    vf = _vf()
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.state import state_cls
    from verifiers.v1.trace import AgentInfo, TraceTask
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     state=state_cls(type(task))(), agent=AgentInfo(config=vf.AgentConfig()))
    kinds = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}
    for m in messages:
        add_node(trace, kinds.get(m["role"], vf.UserMessage)(content=m.get("content") or ""),
                 sampled=m["role"] == "assistant", node=MessageNode)
    return trace


def add_node(trace, message, sampled: bool, node=None) -> None:
    if node is None:
        from verifiers.v1.graph import MessageNode as node
    trace.nodes.append(node(parent=len(trace.nodes) - 1 if trace.nodes else None, message=message,
                            sampled=sampled))


class _Interaction:
    """The agent side of one ``interaction``: turns come from slick's rollout (module doc)."""

    def __init__(self, bridge: "VerifiersEnv"):
        self.bridge = bridge

    @property
    def trace(self):
        return self.bridge.trace

    async def turn(self, message=None):
        from verifiers.v1.agent import Segment
        b = self.bridge
        if b.closing:
            return Segment(messages=[], terminated=True)
        if message is None and b.turns > 0:
            raise ValueError("a bare turn() after the first: give the next user message")
        text = None
        if message is not None:
            text = message if isinstance(message, str) else "\n\n".join(
                _text(m["content"] if isinstance(m, dict) else m.content) for m in message)
        b.reply = asyncio.get_running_loop().create_future()
        await b.events.put(("turn", text))
        reply = await b.reply
        if reply is None:   # the episode ended on slick's side (--max-turns, budget)
            return Segment(messages=[], terminated=True)
        vf = _vf()
        if text is not None:
            add_node(b.trace, vf.UserMessage(content=text), sampled=False)
        msg = vf.AssistantMessage(content=reply)
        add_node(b.trace, msg, sampled=True)
        b.turns += 1
        return Segment(messages=[msg])


class _Seat:
    """The env's one agent seat, played by slick's policy."""

    trainable = True

    def __init__(self, bridge: "VerifiersEnv"):
        self.bridge = bridge

    @asynccontextmanager
    async def interaction(self, task, **_):
        yield _Interaction(self.bridge)

    async def run(self, task, **_):
        async with self.interaction(task) as it:
            await it.turn()
        return self.bridge.trace


class _Agents:
    def __init__(self, name: str, seat: _Seat):
        self._name, self._seat = name, seat

    def __getattr__(self, name: str):
        if name.startswith("__") or name != self.__dict__.get("_name"):
            raise AttributeError(f"no agent {name!r}; slick plays the one seat {self.__dict__.get('_name')!r}")
        return self._seat


class VerifiersEnv:
    """One episode of a verifiers env (slick.rollout.env protocol); ``run(task, agents)`` on the event loop."""

    observation_role = "user"

    def __init__(self, loaded: Loaded, idx: int, sample):
        self.loaded, self.task, self.sample = loaded, loaded.task(idx), sample
        self.trace = new_trace(self.task, prompt_messages(self.task))
        self.events: asyncio.Queue = asyncio.Queue()
        self.reply: Optional[asyncio.Future] = None
        self.closing, self.turns = False, 0
        self.run_task: Optional[asyncio.Task] = None

    async def _drive(self) -> None:
        try:
            await self.loaded.env.run(self.task, _Agents(self.loaded.seat, _Seat(self)))
        except Exception as e:  # noqa: BLE001 - the env's own failure: the episode fails
            await self.events.put(("error", f"{type(e).__name__}: {e}"))
        else:
            await self.events.put(("done", None))

    async def _next(self):
        kind, value = await self.events.get()
        if kind == "error":
            raise RuntimeError(f"verifiers env {type(self.loaded.env).__name__}.run raised {value}")
        return kind, value

    async def reset(self, sample) -> Optional[str]:
        self.run_task = asyncio.get_running_loop().create_task(self._drive())
        kind, text = await self._next()
        if kind == "done":
            raise RuntimeError("the env's run() ended before the policy's first turn")
        if text is not None:
            raise ValueError("the env's first turn sends a message, but the task's prompt opens the conversation")
        return None

    async def step(self, policy_message: str):
        self.reply.set_result(policy_message)
        kind, text = await self._next()
        if kind == "done":
            return None, None, True
        return text or "", None, False

    async def close(self) -> None:
        self.closing = True
        if self.reply is not None and not self.reply.done():
            self.reply.set_result(self._last_reply())
        if self.run_task is not None:
            try:
                await asyncio.wait_for(self.run_task, CLOSE_TIMEOUT)
            finally:
                while not self.events.empty():
                    self.events.get_nowait()
        meta = dict(self.sample.metadata.get(META_KEY) or {})   # a copy: the row's dict is shared
        meta[RUN_REWARDS] = {k: [r.score, r.weight] for k, r in self.trace.rewards.items() if r is not None}
        self.sample.metadata[META_KEY] = meta

    def _last_reply(self) -> Optional[str]:
        """The policy's last turn when the rollout ended without stepping the env (``--max-turns``, budget)."""
        msgs = (self.sample.metadata.get("multiturn") or {}).get("messages") or []
        if msgs and msgs[-1].get("role") == "assistant" and self.turns < sum(m.get("role") == "assistant"
                                                                               for m in msgs):
            return msgs[-1].get("content") or ""
        return None


def factory(spec: EnvSpec):
    def make(args, sample) -> VerifiersEnv:
        meta = (sample.metadata or {}).get(META_KEY)
        if not isinstance(meta, dict) or "idx" not in meta:
            raise ValueError(f"sample {sample.index} has no metadata['{META_KEY}'] (its task): give "
                             f"--prompt-data {spec.name}[?size=N&seed=S]")
        return VerifiersEnv(load(meta.get("env") or spec.id), int(meta["idx"]), sample)
    return make


async def rubric_reward(args, sample) -> float:
    """A ``--custom-rm-path``: the task's rubric (``Task.score``) on the sample's conversation plus the rewards the
    env recorded during its run; ``trace.reward``."""
    meta = (sample.metadata or {}).get(META_KEY) or {}
    if "idx" not in meta:
        raise ValueError(f"sample {sample.index} has no metadata['{META_KEY}']: not a verifiers prompt")
    task = load(meta["env"]).task(int(meta["idx"]))
    msgs = (sample.metadata.get("multiturn") or {}).get("messages")
    if not msgs:
        msgs = prompt_messages(task) + [{"role": "assistant", "content": sample.response or ""}]
    trace = new_trace(task, msgs)
    for name, (score, weight) in (meta.get(RUN_REWARDS) or {}).items():
        trace.record_reward(name, score, weight)
    await task.score(trace)
    return float(trace.reward)
