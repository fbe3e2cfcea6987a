"""End-of-rollout hooks written for slime (--rollout-sample-filter-path, --rollout-all-samples-process-path), as
slime documents them; each records what it was called with, for tests/test_slime_hooks.py."""
from slime.utils.types import Sample

from tests.slime_plugins import generate  # noqa: F401  (the multi-turn script's generate function)

CALLS = []


def remove_odd_samples(args, data):
    """slime's sample filter: mark samples; returns None."""
    CALLS.append(("filter", args.n_samples_per_prompt, [[(type(s) is Sample, s.index, s.prompt) for s in g]
                                                        for g in data]))
    for group in data:
        for s in group:
            if s.index % 2:
                s.remove_sample = True


def record_all(args, all_samples, data_source):
    CALLS.append(("all", args.rollout_batch_size, [[s.index for s in g] for g in all_samples], data_source))


def drop_group_one(args, group):
    return group[0].group_index != 1


async def record_prompt(args, sample, **kwargs):
    """A slime reward function: records the prompt it sees."""
    CALLS.append(("reward", isinstance(sample, Sample), sample.prompt))
    return 0.5


async def reward_func(args, sample, **kwargs):
    """A slime reward returning a dict, read with --reward-key score."""
    return {"score": 1.0 if "4" in sample.response else 0.0, "len": sample.response_length}


def rank_rewards(args, samples):
    """A slime reward post-process: each sample's advantage is its index in the batch minus the mean index."""
    CALLS.append(("post", args.n_samples_per_prompt, [(s.index, s.get_reward_value(args)) for s in samples]))
    raw = [s.get_reward_value(args) for s in samples]
    mean = (len(samples) - 1) / 2
    return raw, [s.index - mean for s in samples]


async def tag_sample(args, sample, *, rollout_id=None, evaluation=False):
    """A slime sample hook (async, with slime's keywords): tags the sample, removes sample 0 from the loss."""
    sample.metadata["hooked"] = [rollout_id, evaluation, args.rollout_batch_size]
    if sample.index == 0:
        sample.remove_sample = True


def label_is_response(args, sample):
    """A second, synchronous hook: returns the sample with its label set to its own response."""
    sample.label = sample.response
    return sample


def change_tokens(args, sample):
    sample.tokens = sample.tokens[:-1]
