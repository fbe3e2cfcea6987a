"""Black-box agents over an OpenAI-compatible API: ``--agent-function-path``.

The agent is any ``async def run(args, sample, base_url) -> None | float | dict``. For every sample slick opens a
*session* and calls ``run`` with ``base_url = http://127.0.0.1:PORT/sessions/<id>/v1``; the agent drives any
OpenAI-compatible client against it (``openai.AsyncOpenAI(base_url=base_url, api_key="slick")``) for as many
``/chat/completions`` or ``/completions`` calls as it likes (at most ``--agent-max-calls``). The endpoint is an
aiohttp server on a free 127.0.0.1 port in the driver's event loop, started at the first rollout and closed with
the run; it generates with the rollout's engine (the in-process engine, or HTTP engines it forwards to), so every
call is recorded with the exact prompt token ids the engine saw, the sampled token ids, their logprobs and the
weight version of each token.

**Sampling in a session** is the rollout's: ``--rollout-temperature``, ``--rollout-top-p`` and ``--rollout-top-k``
replace what a request asks for (the trainer computes logprobs at the rollout temperature, so anything else
would be off-policy), each call's seed derives from ``--rollout-seed``, the sample and the call, and a call
samples at most ``--rollout-max-response-len`` tokens (less when the request's ``max_tokens`` is smaller). The
request's ``stop`` strings are added to ``--rollout-stop``.

**Token-exact chat turns.** When a chat request's messages are an earlier call's messages, then the assistant
message slick answered (any of its choices; content and tool calls compared), then new messages (tool results,
a user turn), the prompt is *not* re-rendered: it is the earlier call's prompt ids + the sampled ids of that
answer + the chat template's token delta for the new messages (:class:`slick.chat.delta.ChatDelta`).
Otherwise (the agent edited the history, or the template rewrites earlier turns) the messages are rendered
afresh. ``/completions`` prompts are taken as given (text is tokenized; token ids are used as they are).

**Trajectory -> training samples.** Calls form a tree: call B continues choice j of call A when B's prompt ids
start with A's prompt ids + that choice's sampled ids (a fresh render that happens to extend counts too). Each
choice that no later call continues ends one training sample: the root call's prompt ids are the sample's
prompt, and its response is the chain's sampled tokens (loss mask 1, the engine's logprobs and weight versions)
with the gaps between them (the tool results, user turns and chat-template tokens that the next prompt added:
loss mask 0, logprob 0, the previous token's version). So a session whose every call extends the previous one
is one sample; an agent that rewrites its history, or asks for ``n > 1`` and continues one choice, yields
several. Every sample of a session gets the session's reward. A session that makes no call becomes one failed
sample (a single loss-mask-0 EOS token) with ``--rm-failure-reward``.

**Reward.** A number or a dict returned by ``run`` is the reward (checked as rewards are). ``None`` means the
configured reward (``--rm-type`` / ``--custom-rm-path``) scores each sample with ``sample.response`` set to its
final assistant message (the last choice's text). An agent that raises, returns something else, or runs past
``--agent-timeout`` fails its sample: ``--rm-failure-reward``, ``sample.metadata["agent_error"]``, counted in
``rollout/agent_errors``. Sessions are not resumed across aborts: an aborted session's sample starts over.

Metrics: ``rollout/agent_calls/mean`` (calls per session), ``rollout/agent_samples/mean`` (training samples per
session), ``rollout/agent_errors``.
"""
from __future__ import annotations

import asyncio
import copy
import inspect
import json
import logging
import random
import time
import uuid
from typing import Any, Optional

from slick.algo.sessions import SESSION_KEY   # the training side of split sessions: slick/algo/sessions.py
from slick.chat.delta import ChatDelta, ChatTemplateRewriteError
from slick.config import Config
from slick.serve.http_guard import HostPolicy, guard_middleware
from slick.serve.openai_api import OpenAIEndpoint
from slick.serve.openai_protocol import Call, OpenAIError, render_chat, template_messages
from slick.plugins import load_function
from slick.reward.evidence import reply_evidence
from slick.reward.hub import check_reward
from slick.rollout.multiturn import append_env_tokens
from slick.types import FINISH_TO_STATUS, SamplingParams, Sample, Status

log = logging.getLogger("slick.agent")


class AgentSession:
    """The calls of one agent run (see the module doc). ``base`` is the rollout's sampling for this sample."""

    def __init__(self, sid: str, tokenizer, base: SamplingParams, max_calls: int):
        self.id, self.tok, self.base, self.max_calls = sid, tokenizer, base, max_calls
        self.calls: list[Call] = []
        self.closed = False
        self.aborted = False     # the engine aborted one of its requests: the rollout is stopping
        self._started = 0

    # hooks called by OpenAIEndpoint for /sessions/<id>/v1/...
    def max_new_tokens(self, requested: Optional[int], room: Optional[int]) -> int:
        if self.aborted:
            raise OpenAIError(f"agent session {self.id}: the rollout stopped this session (a request was aborted); "
                              "it will start over", 400)
        if self._started >= self.max_calls:
            raise OpenAIError(f"agent session {self.id} made {self.max_calls} calls, the most --agent-max-calls "
                              "allows", 429, type="rate_limit_error")
        self._started += 1
        return min(x for x in (requested, room, self.base.max_new_tokens) if x is not None)

    def sampling(self, params, max_new_tokens: int, index: int) -> SamplingParams:
        seed = random.Random(f"slick-agent:{self.base.seed}:{self._started}:{index}").getrandbits(63)
        stop = list(self.base.stop or []) + [s for s in params.stop if s not in (self.base.stop or [])]
        return SamplingParams(temperature=self.base.temperature, top_p=self.base.top_p, top_k=self.base.top_k,
                              max_new_tokens=max_new_tokens, stop=stop or None,
                              stop_token_ids=self.base.stop_token_ids, seed=seed, ignore_eos=params.ignore_eos)

    def chat_prompt(self, messages: list[dict], tools: Optional[list]) -> tuple[list[int], str, Optional[tuple]]:
        """Prompt ids, text and parent (call, choice) for a chat request (token-exact continuation when possible)."""
        for ci in range(len(self.calls) - 1, -1, -1):
            call = self.calls[ci]
            k = len(call.messages or [])
            if call.kind != "chat" or call.tools != tools or len(messages) <= k + 1 or messages[:k] != call.messages:
                continue
            for j, ch in enumerate(call.choices):
                if ch.finish_reason == "abort" or not same_assistant(messages[k], ch.message):
                    continue
                tmsgs, ttools = template_messages(self.tok, call.messages, tools)
                new, _ = template_messages(self.tok, messages[k + 1:], None)
                try:
                    delta = ChatDelta(self.tok, tmsgs, ttools, prompt_text=call.prompt_text)
                    delta.add_policy_turn(ch.token_ids)
                    ids = delta.append(new)
                except ChatTemplateRewriteError as e:
                    log.warning("agent session %s: %s; rendering the conversation afresh (a new sample)", self.id, e)
                    break
                return list(call.prompt_ids) + list(ch.token_ids) + ids, delta.text, (ci, j)
        ids, text = render_chat(self.tok, messages, tools)
        return ids, text, None

    def record(self, call: Call) -> None:
        if not self.closed:
            self.calls.append(call)
            self.aborted |= any(c.finish_reason == "abort" for c in call.choices)


def same_assistant(sent: dict, returned: Optional[dict]) -> bool:
    """Whether the assistant message a client sent back is the one slick answered (content and tool calls)."""
    if returned is None or sent.get("role") != "assistant":
        return False
    if (sent.get("content") or "").strip() != (returned.get("content") or "").strip():
        return False
    a = [(c["function"]["name"], c["function"]["arguments"]) for c in sent.get("tool_calls") or []]
    b = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in returned.get("tool_calls") or []]
    return a == b


# ----------------------------------------------------------------------------- trajectory -> samples
def _extends(prompt: list[int], base: list[int]) -> bool:
    return len(prompt) > len(base) and prompt[:len(base)] == base


def call_tree(calls: list[Call]) -> dict[int, tuple[int, int]]:
    """``{call: (parent call, choice)}``: the latest earlier choice whose prompt + sampled ids the call's prompt
    extends (the recorded parent first, when it still checks out)."""
    parents = {}
    for ci, call in enumerate(calls):
        cands = [call.parent] if call.parent is not None else []
        cands += [(pi, pj) for pi in range(ci - 1, -1, -1) for pj in range(len(calls[pi].choices))]
        for pi, pj in cands:
            p = calls[pi]
            if p.choices[pj].finish_reason != "abort" and \
                    _extends(call.prompt_ids, list(p.prompt_ids) + list(p.choices[pj].token_ids)):
                parents[ci] = (pi, pj)
                break
    return parents


def trajectory_samples(sample: Sample, calls: list[Call], session_id: str = "") -> list[Sample]:
    """The training samples of a session's calls (module doc), copies of ``sample`` with their tokens filled in."""
    parents = call_tree(calls)
    continued = set(parents.values())
    out = []
    for ci, call in enumerate(calls):
        for cj, ch in enumerate(call.choices):
            if (ci, cj) in continued or not ch.token_ids:
                continue
            chain = [(ci, cj)]
            while chain[-1][0] in parents:
                chain.append(parents[chain[-1][0]])
            chain.reverse()
            s = copy.deepcopy(sample)
            s.prompt_ids = list(calls[chain[0][0]].prompt_ids)
            s.response_ids, s.rollout_logprobs, s.loss_mask, s.weight_versions = [], [], [], []
            end = len(s.prompt_ids)
            for a, b in chain:
                c = calls[a]
                append_env_tokens(s, c.prompt_ids[end:])        # the gap: tool results, template tokens
                x = c.choices[b]
                s.response_ids += x.token_ids
                s.rollout_logprobs += x.logprobs
                s.loss_mask += [1] * len(x.token_ids)
                s.weight_versions += x.weight_versions
                end = len(c.prompt_ids) + len(x.token_ids)
            s.response = ch.text if ch.message is None else (ch.message.get("content") or "")
            s.status = FINISH_TO_STATUS.get(ch.finish_reason, Status.FAILED)
            s.metadata = {**s.metadata, SESSION_KEY: {"id": session_id, "calls": len(calls),
                                                      "chain": [list(x) for x in chain]}}
            out.append(s)
    return out


def failed_sample(sample: Sample, tokenizer, error: str, reward: float, calls: int = 0) -> Sample:
    """The one sample of a session that produced nothing trainable: one EOS token with loss mask 0."""
    s = copy.deepcopy(sample)
    if not s.prompt_ids:
        s.prompt_ids = [tokenizer.eos_token_id or 0]
    s.response_ids, s.rollout_logprobs, s.loss_mask, s.weight_versions = [tokenizer.eos_token_id or 0], [0.0], [0], [0]
    s.response, s.reward, s.status = "", float(reward), Status.FAILED
    s.metadata = {**s.metadata, "agent_error": error, SESSION_KEY: {"id": uuid.uuid4().hex, "calls": calls,
                                                                    "chain": []}}
    return s


# ----------------------------------------------------------------------------- the rollout
class AgentRollout:
    """Runs ``--agent-function-path`` for every sample of a group and turns its sessions into samples.

    ``engine`` is a zero-argument callable returning the engine to generate with (the rollout manager's, which
    slick train-async swaps for an interruptible wrapper)."""

    def __init__(self, cfg: Config, engine, tokenizer, rewards):
        self.cfg, self._engine, self.tok, self.rewards = cfg, engine, tokenizer, rewards
        self.fn = load_function(cfg.agent_function_path, "--agent-function-path")
        if not inspect.iscoroutinefunction(self.fn):
            raise ValueError(f"--agent-function-path {cfg.agent_function_path!r}: must be an `async def run(args, "
                             f"sample, base_url)`, got a plain function")
        self.sessions: dict[str, AgentSession] = {}
        self._runner = None
        self._loop = None
        self.url: Optional[str] = None
        self.errors = 0

    @classmethod
    def from_config(cls, cfg: Config, engine, tokenizer, rewards) -> Optional["AgentRollout"]:
        return cls(cfg, engine, tokenizer, rewards) if cfg.agent_function_path else None

    async def start(self) -> str:
        """Serve the endpoint on a free 127.0.0.1 port in the running event loop (once per loop)."""
        loop = asyncio.get_running_loop()
        if self._runner is not None and self._loop is loop:
            return self.url
        from aiohttp import web

        eng = self._engine()
        endpoint = OpenAIEndpoint(self._engine, self.tok, model_name=str(self.cfg.hf_checkpoint),
                                  max_context=getattr(eng, "max_context", None),
                                  vocab_size=getattr(eng, "vocab_size", None) or len(self.tok),
                                  eos_ids=_eos_ids(eng, self.tok), sessions=self,
                                  tool_parser=self.cfg.tool_parser or "hermes")
        # no web page may drive or read a session (Host and Origin checked, as on slick serve: docs/security.md)
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[guard_middleware(HostPolicy())])
        endpoint.add_routes(app)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner, self._loop = runner, loop
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        log.info("agent endpoint at %s/sessions/<id>/v1", self.url)
        return self.url

    async def close(self) -> None:
        """Stop the endpoint (open sessions are closed; their requests answer 404)."""
        for s in self.sessions.values():
            s.closed = True
        self.sessions.clear()
        if self._runner is not None and self._loop is asyncio.get_running_loop():
            await self._runner.cleanup()
        self._runner = self._loop = None

    def get(self, sid: str) -> Optional[AgentSession]:
        s = self.sessions.get(sid)
        return None if s is None or s.closed else s

    async def run_session(self, sample: Sample, sampling: SamplingParams) -> tuple[list[Sample], Any, bool]:
        """Run the agent once for ``sample``: (its samples, the returned reward or None, whether it failed)."""
        url = await self.start()
        sid = uuid.uuid4().hex
        session = AgentSession(sid, self.tok, sampling, self.cfg.agent_max_calls)
        self.sessions[sid] = session
        t0 = time.perf_counter()
        error, result = None, None
        try:
            result = await asyncio.wait_for(self.fn(self.cfg, sample, f"{url}/sessions/{sid}/v1"),
                                            timeout=self.cfg.agent_timeout)
            if result is not None:
                result = check_reward(result, self.cfg.reward_key, sample.index)
        except asyncio.TimeoutError:
            error = f"agent session ran past --agent-timeout {self.cfg.agent_timeout} s"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the agent's failure fails its sample, not the run
            error = f"{type(e).__name__}: {e}"
        finally:
            session.closed = True
            self.sessions.pop(sid, None)
        if session.aborted:          # the rollout is stopping: the sample starts over later (module doc)
            s = copy.deepcopy(sample)
            s.status = Status.ABORTED
            return [s], None, False
        samples = [] if error else trajectory_samples(sample, session.calls, sid)
        if not error and not samples:
            error = "the agent made no completion call" if not session.calls else "every completion was empty"
        if error:
            self.errors += 1
            log.warning("agent session for sample %d failed: %s", sample.index, error)
            samples = [failed_sample(sample, self.tok, error, self.cfg.rm_failure_reward, len(session.calls))]
        for s in samples:
            s.timings["generate"] = time.perf_counter() - t0
        return samples, result, error is not None

    async def run_group(self, group: list[Sample], sampling: SamplingParams, seed_fn,
                        final_only: bool = False) -> list[Sample]:
        """Run one session per unfinished sample, set rewards, and return the group's training samples.

        ``seed_fn(sample)`` gives the sample's seeded sampling. ``final_only`` (evaluation) keeps one sample per
        session, the one that ends with its last call, so a group keeps one sample per prompt sample. When a
        session was aborted the original samples come back with status ABORTED (reset to start over), so the
        caller can put the group back unchanged."""
        todo = [s for s in group if s.status in (Status.PENDING, Status.ABORTED)]
        done = await asyncio.gather(*(self.run_session(s, seed_fn(s)) for s in todo))
        if final_only:
            done = [(samples[-1:], result, failed) for samples, result, failed in done]
        if any(x.status == Status.ABORTED for samples, _, _ in done for x in samples):
            for s in todo:
                s.status, s.response_ids, s.rollout_logprobs, s.loss_mask, s.weight_versions = \
                    Status.ABORTED, [], [], [], []
            return group
        to_score = []
        for samples, result, failed in done:
            for x in samples:
                if failed:
                    continue
                if result is not None:
                    x.reward = copy.deepcopy(result)
                    x.evidence = reply_evidence("agent", copy.deepcopy(result), 0.0)   # the agent's own reward
                else:
                    to_score.append(x)
        if to_score:
            t0 = time.perf_counter()
            await self.rewards.score_group(to_score)
            for x in to_score:
                x.timings["reward"] = time.perf_counter() - t0
        kept = [s for s in group if s not in todo]
        return kept + [x for samples, _, _ in done for x in samples]

    def metrics(self, samples: list[Sample]) -> dict:
        """rollout/agent_* metrics of a batch (empty when no sample came from an agent session)."""
        sessions = {}
        for s in samples:
            info = s.metadata.get(SESSION_KEY)
            if info is not None:
                sessions.setdefault(info["id"], [info["calls"], 0])[1] += 1
        if not sessions:
            return {}
        n = len(sessions)
        errors, self.errors = self.errors, 0
        return {"rollout/agent_calls/mean": sum(c for c, _ in sessions.values()) / n,
                "rollout/agent_samples/mean": sum(k for _, k in sessions.values()) / n,
                "rollout/agent_errors": float(errors)}


def _eos_ids(engine, tokenizer) -> set:
    ids = set(getattr(engine, "eos_ids", ()) or ())
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
