"""Start-up checks of the environments users bring: reasoning-gym prompt data and MCP tool servers.

* ``--prompt-data`` / ``--eval-prompt-data`` ``reasoning-gym:TASK[,TASK...][?...]``: the spec parses, reasoning-gym
  is installed, the tasks exist (slick/data/reasoning_gym.py); the prompts are chat messages (a system prompt asking
  for ``<answer>`` tags) unless ``system=none``, so they need ``--apply-chat-template``; a held-out set with the
  training set's task and seed would hold the training prompts.
* ``--mcp-server`` / ``--mcp-url`` (slick/rollout/mcp.py): one of them, the SDK installed, a loopback URL unless
  ``--mcp-allow-remote``, the command non-empty, and turns to use the tools in (``--max-turns >= 2``) unless a
  black-box agent (``--agent-function-path``) calls them itself (``slick.rollout.tools.run_tools``).
"""
from __future__ import annotations

import json
import shlex

from slick.config import Config
from slick.reward import reasoning_gym as rg_data
from slick.rollout import envs as user_envs
from slick.rollout.mcp import INSTALL as MCP_INSTALL, url_problem


def data_specs(cfg: Config) -> list[tuple[str, str]]:
    """(flag, spec) of every prompt set of the run."""
    specs = [("--prompt-data", cfg.prompt_data)] if cfg.prompt_data else []
    return specs + [("--eval-prompt-data", s) for s in cfg.eval_prompt_data[1::2]]


def is_generated(spec: str) -> bool:
    """Whether a prompt spec is generated (no file to look for)."""
    path = spec.split("@[", 1)[0]
    return rg_data.is_spec(path) or user_envs.is_spec(path)


def reasoning_gym_problems(cfg: Config, p: list[str]) -> None:
    seen = {}
    for flag, spec in data_specs(cfg):
        path = spec.split("@[", 1)[0]
        if not rg_data.is_spec(path):
            continue
        try:
            rg_data.check(path)
        except ValueError as e:
            p.append(f"{flag}: {e}")
            continue
        s = rg_data.parse(path)
        if s.system != "none" and not cfg.apply_chat_template:
            p.append(f"{flag} {spec}: the prompts are chat messages (reasoning-gym's '{s.system}' system prompt, "
                     f"then the question): pass --apply-chat-template, or system=none for the bare question")
        for task in s.tasks:
            key = (task, s.seed, json.dumps(s.config, sort_keys=True, default=str))   # list values too
            if key in seen and seen[key][0] != flag:
                p.append(f"{flag} {spec}: task {task} with seed {s.seed} is also in {seen[key][0]} {seen[key][1]}: "
                         f"the same items; give the held-out set another seed")
            seen.setdefault(key, (flag, spec))


def mcp_problems(cfg: Config, p: list[str]) -> None:
    if not (cfg.mcp_server or cfg.mcp_url):
        return
    if cfg.mcp_server and cfg.mcp_url:
        p.append("--mcp-server and --mcp-url: give one MCP server (a stdio command or an HTTP URL)")
    try:
        import mcp  # noqa: F401  # optional dependency: the envs extra
    except ImportError as e:
        p.append(f"--mcp-server/--mcp-url need the MCP SDK ({e}): {MCP_INSTALL}")
    if cfg.mcp_url:
        problem = url_problem(cfg.mcp_url, cfg.mcp_allow_remote)
        if problem:
            p.append(problem)
    if cfg.mcp_server is not None:
        try:
            if not shlex.split(cfg.mcp_server):
                p.append("--mcp-server: empty command")
        except ValueError as e:
            p.append(f"--mcp-server {cfg.mcp_server!r}: {e}")
    if cfg.mcp_startup_timeout <= 0:
        p.append(f"--mcp-startup-timeout must be > 0 seconds (got {cfg.mcp_startup_timeout})")
    if cfg.max_turns < 2 and not cfg.agent_function_path:
        p.append("--mcp-server/--mcp-url need --max-turns >= 2 (with one turn no tool result is ever read), or "
                 "--agent-function-path for an agent that calls the tools itself")


REWARDS = {"verifiers": "slick.rollout.envs.verifiers.rubric_reward", "textarena": "slick.rollout.env.env_reward"}


def environment_problems(cfg: Config, p: list[str]) -> None:
    """``--environment KIND:ID``: it loads, its prompts come from ``--prompt-data KIND:ID[?...]``, a reward is set."""
    for flag, spec in data_specs(cfg):
        path = spec.split("@[", 1)[0]
        if user_envs.is_spec(path) and not cfg.environment:
            p.append(f"{flag} {spec}: an environment's prompts need --environment {path.split('?', 1)[0]}")
    if not cfg.environment:
        return
    try:
        env = user_envs.check(cfg.environment)
    except ValueError as e:
        p.append(f"--environment: {e}")
        return
    if cfg.environment_path:
        p.append("--environment and --environment-path: give one environment")
    prompt = (cfg.prompt_data or "").split("@[", 1)[0]
    if not user_envs.is_spec(prompt) or user_envs.parse(prompt).name != env.name:
        p.append(f"--environment {env.name} needs its prompts: --prompt-data {env.name}[?size=N&seed=S] "
                 f"(got {cfg.prompt_data!r})")
    if not cfg.apply_chat_template:
        p.append(f"--environment {env.name}: the prompts are chat messages: pass --apply-chat-template")
    if not cfg.custom_rm_path:
        p.append(f"--environment {env.name}: no reward; --custom-rm-path {REWARDS[env.kind]} gives the "
                 f"{'rubric' if env.kind == 'verifiers' else 'game'}'s")


def turn_problems(cfg: Config, p: list[str]) -> None:
    if not 0.0 <= cfg.turn_gamma <= 1.0:
        p.append(f"--turn-gamma must be in [0, 1] (got {cfg.turn_gamma})")


def env_problems(cfg: Config, p: list[str]) -> None:
    reasoning_gym_problems(cfg, p)
    mcp_problems(cfg, p)
    environment_problems(cfg, p)
    turn_problems(cfg, p)
