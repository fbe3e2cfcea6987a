"""Plug-ins written for slime, as slime's docs and examples write them (examples/search-r1/generate_with_search.py:
`async def generate(args, sample, sampling_params)` posting SGLang /generate requests to the router, slime's Sample
fields and Sample.Status). slick loads them by dotted path; `slime` resolves to slick.compat.slime here."""
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

MAX_TURNS = 2
SEEN = []   # (sglang_router_ip, sglang_router_port, sampling_params) of each call, for the tests


async def generate(args, sample: Sample, sampling_params) -> Sample:
    """A two-turn search-style rollout: the policy writes, an observation (loss mask 0) is appended, it writes again."""
    assert not args.partial_rollout, "Partial rollout is not supported for this function at the moment."
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    SEEN.append((args.sglang_router_ip, args.sglang_router_port, dict(sampling_params)))

    prompt_text = sample.prompt
    prompt_tokens_ids = state.tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    response = ""
    response_token_ids = []
    loss_mask = []
    rollout_log_probs = []
    sampling_params = {**sampling_params, "max_new_tokens": 6}

    for turn in range(MAX_TURNS):
        payload = {"text": prompt_text + response, "sampling_params": sampling_params, "return_logprob": True}
        output = await post(url, payload)
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        cur_response = output["text"]
        cur_response_token_ids = [item[1] for item in output["meta_info"]["output_token_logprobs"]]
        cur_response_log_probs = [item[0] for item in output["meta_info"]["output_token_logprobs"]]
        response += cur_response
        response_token_ids += cur_response_token_ids
        loss_mask += [1] * len(cur_response_token_ids)
        rollout_log_probs += cur_response_log_probs
        if turn == MAX_TURNS - 1:
            break
        next_obs = f"\n\n<information>Doc {turn + 1}: forty-two.</information>\n\n"
        obs_tokens_ids = state.tokenizer(next_obs, add_special_tokens=False)["input_ids"]
        response += next_obs
        response_token_ids += obs_tokens_ids
        loss_mask += [0] * len(obs_tokens_ids)
        rollout_log_probs += [0.0] * len(obs_tokens_ids)

    sample.tokens = prompt_tokens_ids + response_token_ids
    sample.response_length = len(response_token_ids)
    sample.response = response
    sample.loss_mask = loss_mask
    sample.prompt = prompt_text
    sample.rollout_log_probs = rollout_log_probs
    sample.metadata["turns"] = MAX_TURNS
    match output["meta_info"]["finish_reason"]["type"]:
        case "length":
            sample.status = Sample.Status.TRUNCATED
        case "abort":
            sample.status = Sample.Status.ABORTED
        case "stop":
            sample.status = Sample.Status.COMPLETED
    return sample


async def generate_without_logprobs(args, sample: Sample, sampling_params) -> Sample:
    """slime's single-turn pattern with append_response_tokens, then the logprobs thrown away (slick's record of
    the served generations puts the engine's back)."""
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    output = await post(url, {"input_ids": sample.tokens, "sampling_params": sampling_params, "return_logprob": True})
    pairs = output["meta_info"]["output_token_logprobs"]
    sample.append_response_tokens(args, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs],
                                  meta_info=output["meta_info"], text=output["text"])
    sample.rollout_log_probs = None
    return sample


def drop_every_group(args, samples: list[Sample], **kwargs):
    return DynamicFilterOutput(keep=False, reason="all")


def drop_but_keep_when_insufficient(args, samples: list[Sample], **kwargs):
    return DynamicFilterOutput(keep=False, reason="fallback", keep_when_insufficient=True)


def keep_if_reward_value(args, samples: list[Sample], **kwargs):
    """Uses slime's Sample API (get_reward_value, tokens, response_length): slick passes slime's shape."""
    assert all(isinstance(s, Sample) and len(s.tokens) > s.response_length > 0 for s in samples)
    return DynamicFilterOutput(keep=all(s.get_reward_value(args) is not None for s in samples))


async def reward_func(args, sample, **kwargs):
    """slime's custom reward signature (examples/search-r1: `async def reward_func(args, sample, **kwargs)`)."""
    return 1.0 if "forty-two" in sample.response else 0.0
