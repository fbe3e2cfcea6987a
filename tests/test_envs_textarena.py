"""``--environment textarena:GAME`` with the real TextArena 0.7.4 (slick/rollout/envs/textarena.py): seeded prompt
rows, the game's observations, reward and end as slick's environment protocol, episodes through the real rollout
(LocalEngine, tiny random model) with the game's messages masked, and a bad row failing only its sample."""
import asyncio
import copy

import pytest

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.data import DataError, load_prompt_rows
from slick.data.source import DataSource
from slick.rollout.envs.textarena import TextArenaEnv, observation_text
from slick.types import Status

pytest.importorskip("textarena")

GAME = "GuessTheNumber-v0"
INVALID = "You attempted an invalid move."


def test_rows_are_seeded_games():
    rows = load_prompt_rows(f"textarena:{GAME}?size=3&seed=7")
    assert [r["metadata"]["textarena"] for r in rows] == [{"game": GAME, "seed": s} for s in (7, 8, 9)]
    system, user = rows[0]["prompt"]
    assert system["role"] == "system" and user["role"] == "user"
    assert user["content"].startswith("You are Player 0. You are playing Guess The Number.")
    assert "between 1 and 20 within 10 turns" in user["content"]
    assert load_prompt_rows(f"textarena:{GAME}?size=3&seed=7@[1:3]") == rows[1:3]
    with pytest.raises(DataError, match="no such game"):
        load_prompt_rows("textarena:NoSuchGame-v0")
    with pytest.raises(DataError, match="size must be >= 1"):
        load_prompt_rows(f"textarena:{GAME}?size=0")


def test_a_game_played_by_hand():
    # seed 7: the hidden number is 11 (TextArena seeds Python's random at reset)
    env = TextArenaEnv(GAME, 7)
    assert env.reset(None) is None
    assert env.game.env.game_number == 11 if hasattr(env.game, "env") else env.game.game_number == 11
    assert env.step("I guess [10]") == ("The target number is higher.", None, False)
    assert env.step("[12]") == ("The target number is lower.", None, False)
    assert env.step("It is [11]") == (None, 1.0, True)
    # two invalid moves in a row: the game ends with its completion score, 0.0 before any valid guess
    env = TextArenaEnv(GAME, 7)
    env.reset(None)
    obs, reward, done = env.step("eleven")
    assert obs.startswith(INVALID) and (reward, done) == (None, False)
    assert env.step("twelve") == (None, 0.0, True)
    assert observation_text([(0, "[3]", None), (-1, " higher ", None)]) == "higher"


def test_start_up_checks():
    base = dict(hf_checkpoint=None, environment=f"textarena:{GAME}", apply_chat_template=True, max_turns=3,
                custom_rm_path="slick.rollout.env.env_reward")
    with pytest.raises(ConfigError, match="needs its prompts: --prompt-data textarena:GuessTheNumber-v0"):
        validate_config(Config.from_flat(dict(base, prompt_data="p.jsonl")), check_files=False)
    with pytest.raises(ConfigError, match="no such game"):
        validate_config(Config.from_flat(dict(base, environment="textarena:Nope-v0", prompt_data="textarena:Nope-v0")),
                        check_files=False)
    with pytest.raises(ConfigError, match="no reward; --custom-rm-path slick.rollout.env.env_reward"):
        validate_config(Config.from_flat(dict(base, prompt_data=f"textarena:{GAME}", custom_rm_path=None)),
                        check_files=False)


def test_episodes_through_the_rollout(tiny_model_dir):
    """The random policy never writes a valid [number]: each game answers the first turn with the invalid-move
    message (masked) and ends after the second with reward 0.0; a row without its game seed fails alone."""
    from slick.engine.local import LocalEngine
    from slick.models.tiny import load_demo_tokenizer
    from slick.reward.hub import RewardHub
    from slick.rollout.manager import RolloutManager

    tok = copy.deepcopy(load_demo_tokenizer())
    cfg = validate_config(Config.from_flat(dict(
        hf_checkpoint=str(tiny_model_dir), dtype="fp32", device="cpu", seed=7, max_turns=4,
        environment=f"textarena:{GAME}", prompt_data=f"textarena:{GAME}?size=3&seed=7", apply_chat_template=True,
        custom_rm_path="slick.rollout.env.env_reward", rollout_batch_size=3, n_samples_per_prompt=2,
        rollout_max_response_len=400, max_tokens_per_turn=3, rm_failure_reward=-1.0)), check_files=False)
    rows = load_prompt_rows(cfg.prompt_data)
    rows[2] = dict(rows[2], metadata={})          # no game seed: the factory raises
    for r in rows:
        r["prompt_ids"] = tok(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False),
                              add_special_tokens=False)["input_ids"]
    engine = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=8, seed=0)
    manager = RolloutManager(cfg, DataSource(rows, 2), engine, RewardHub(cfg), tok)
    groups, metrics = asyncio.run(manager.generate_rollout(0))
    samples = [s for g in groups for s in g]
    played = [s for s in samples if s.prompt_index != 2]
    assert len(played) == 4 and metrics["rollout/env_errors"] == 2.0
    for s in played:
        st = s.metadata["multiturn"]
        assert st["turns"] == 2 and st["env_reward"] == 0.0 and s.reward == 0.0 and s.status != Status.FAILED
        masked = [t for t, m in zip(s.response_ids, s.loss_mask) if m == 0]
        assert INVALID in tok.decode(masked)                  # the game's message: observation tokens, mask 0
        assert INVALID not in tok.decode([t for t, m in zip(s.response_ids, s.loss_mask) if m == 1])
        assert [m["role"] for m in st["messages"]][-3:] == ["assistant", "user", "assistant"]
    for s in samples:
        if s.prompt_index == 2:
            assert s.status == Status.FAILED and s.reward == -1.0 and set(s.loss_mask) <= {0}
            assert "no metadata['textarena']" in s.metadata["env_error"]
