"""``--environment textarena:GAME``: a single-player TextArena (0.7.4) game as a slick environment.

Prompts (``--prompt-data textarena:GAME?size=N&seed=S``): row ``i`` is the game reset with seed ``S + i``; its
prompt is a system message (the move format) and the game's opening observation as the user message;
``metadata["textarena"] = {"game", "seed"}``. Every sample of a group plays the same seeded game.

The game runs unwrapped (TextArena's ``GAME-raw`` registration when there is one: its LLM wrappers repeat the whole
history in every observation, which a chat already holds). Each policy turn is one ``game.step(move)``; the
observation is the game's new messages to the player (its own move, which the chat holds already, left out);
when the game is done the episode ends with the game's reward for player 0 (``rewards[0]``), which
``--custom-rm-path slick.rollout.env.env_reward`` makes the sample's reward. A game cut by ``--max-turns`` before
it ends gets no game reward (0.0 with ``env_reward``). TextArena seeds Python's global ``random`` at reset; reset
runs on the event loop, one game at a time.
"""
from __future__ import annotations

from typing import Any

from slick.rollout.envs.spec import INSTALL, EnvSpec, EnvSpecError

META_KEY = "textarena"
SYSTEM_PROMPT = ("You are playing a text game. Read the rules, think briefly, then give your move in the exact "
                 "format the game asks for (for example a number in square brackets, [5]).")
PLAYER = 0


def _ta():
    try:
        import textarena
    except ImportError as e:
        raise EnvSpecError(f"textarena:...: textarena is not installed ({e}): {INSTALL}") from None
    return textarena


def game_id(game: str) -> str:
    """The registration to make: ``GAME-raw`` (no observation wrappers) when TextArena has it."""
    from textarena.envs.registration import ENV_REGISTRY
    return f"{game}-raw" if f"{game}-raw" in ENV_REGISTRY else game


def check(spec: EnvSpec) -> None:
    _ta()
    from textarena.envs.registration import ENV_REGISTRY
    if spec.id not in ENV_REGISTRY:
        near = sorted(k for k in ENV_REGISTRY if k.lower().startswith(spec.id.split("-")[0].lower()[:4]))[:8]
        raise EnvSpecError(f"textarena:{spec.id}: no such game" + (f" (close: {', '.join(near)})" if near else ""))
    game = make_game(spec.id, spec.seed)
    if getattr(game.state, "num_players", 1) != 1:
        raise EnvSpecError(f"textarena:{spec.id}: not a single-player game")


def make_game(game: str, seed: int):
    """A fresh game reset for one player with ``seed``."""
    ta = _ta()
    env = ta.make(env_id=game_id(game))
    env.reset(num_players=1, seed=seed)
    return env


def observation_text(messages: Any) -> str:
    """The game's messages to the player (``(from_id, message, type)`` tuples), its own moves left out."""
    if isinstance(messages, str):
        return messages.strip()
    parts = [str(m[1]).strip() for m in messages if not (isinstance(m, (tuple, list)) and m[0] == PLAYER)]
    return "\n".join(p for p in parts if p)


def prompt_rows(spec: EnvSpec) -> tuple[list, list]:
    check(spec)
    rows, where = [], []
    for i in range(spec.size):
        seed = spec.seed + i
        _, obs = make_game(spec.id, seed).get_observation()
        prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": observation_text(obs)}]
        rows.append({"prompt_index": i, "prompt": prompt, "label": None,
                     "metadata": {META_KEY: {"game": spec.id, "seed": seed}}, "tools": None})
        where.append(f"{spec.name} seed {seed}")
    return rows, where


class TextArenaEnv:
    """One game per sample (slick.rollout.env protocol)."""

    observation_role = "user"

    def __init__(self, game: str, seed: int):
        self.game_name, self.seed = game, seed
        self.game = None
        self.moves = 0

    def reset(self, sample) -> None:
        self.game = make_game(self.game_name, self.seed)
        self.game.get_observation()   # the opening observation is the prompt already
        return None

    def step(self, move: str):
        self.moves += 1
        done, _info = self.game.step(move)
        if done:
            rewards, _game_info = self.game.close()
            reward = (rewards or {}).get(PLAYER)
            return None, (None if reward is None else float(reward)), True
        _, obs = self.game.get_observation()
        return observation_text(obs) or "(no change)", None, False


def factory(spec: EnvSpec):
    def make(args, sample) -> TextArenaEnv:
        meta = (sample.metadata or {}).get(META_KEY)
        if not isinstance(meta, dict) or "seed" not in meta:
            raise ValueError(f"sample {sample.index} has no metadata['{META_KEY}'] (game seed): give "
                             f"--prompt-data {spec.name}[?size=N&seed=S]")
        return TextArenaEnv(meta.get("game") or spec.id, int(meta["seed"]))
    return make
