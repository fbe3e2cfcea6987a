"""A reward function written against slime (`from slime.utils.types import Sample`) gets slime's Sample."""
import asyncio
import sys
import textwrap

from slick.config import Config
from slick.reward.hub import RewardHub
from slick.types import Sample

SLIME_RM = textwrap.dedent('''
    from slime.utils.types import Sample

    async def reward_func(args, sample, **kwargs):
        """as slime's examples write one: it checks the type and reads slime's field names"""
        assert isinstance(sample, Sample), type(sample)
        return float(sample.response_length) + (1.0 if "two" in sample.prompt else 0.0)

    def group_rm(args, samples, **kwargs):
        assert all(isinstance(s, Sample) for s in samples)
        return [float(len(s.tokens)) for s in samples]
''')


def _hub(tmp_path, fn, group=False):
    (tmp_path / "slime_style_rm.py").write_text(SLIME_RM)
    sys.path.insert(0, str(tmp_path))
    try:
        return RewardHub(Config.from_flat({"custom_rm_path": f"slime_style_rm.{fn}", "group_rm": group}))
    finally:
        sys.path.remove(str(tmp_path))


def _samples():
    return [Sample(index=i, prompt=p, prompt_ids=[1, 2, 3], response_ids=[5] * (i + 1), response="x",
                   loss_mask=[1] * (i + 1), rollout_logprobs=[-0.5] * (i + 1)) for i, p in enumerate(["one", "two"])]


def test_a_slime_reward_function_gets_slimes_sample(tmp_path):
    hub, samples = _hub(tmp_path, "reward_func"), _samples()
    asyncio.run(hub.score_group(samples))
    assert [s.reward for s in samples] == [1.0, 3.0]     # response_length (+1 for the prompt saying "two")


def test_a_slime_group_reward_function_gets_slimes_samples(tmp_path):
    hub, samples = _hub(tmp_path, "group_rm", group=True), _samples()
    asyncio.run(hub.score_group(samples))
    assert [s.reward for s in samples] == [4.0, 5.0]     # prompt 3 tokens + response 1 or 2


def test_a_slime_reward_function_sees_the_prompt_as_slime_gives_it(tiny_model_dir):
    """With --apply-chat-template the chat-templated text the engine was given (what slime's generate and filter
    plug-ins see too); without it the row's prompt as it is (here a list of messages)."""
    from transformers import AutoTokenizer

    from slick.compat.finder import install

    install()
    from tests.slime_hook_plugins import CALLS

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for template, want in ((True, tok.decode(ids, skip_special_tokens=False)), (False, messages)):
        hub = RewardHub(Config.from_flat({"custom_rm_path": "tests.slime_hook_plugins.record_prompt"}))
        hub.use_tokenizer(tok, template)
        sample = Sample(index=0, prompt=messages, prompt_ids=ids, response_ids=[5], response="4", loss_mask=[1],
                        rollout_logprobs=[-0.5])
        CALLS.clear()
        asyncio.run(hub.score_group([sample]))
        assert CALLS == [("reward", True, want)] and sample.reward == 0.5
        if template:
            assert "Be brief." in want and "What is 2 + 2?" in want and want != "Be brief.\nWhat is 2 + 2?"
