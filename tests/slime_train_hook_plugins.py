"""slime train-side hook plug-ins for tests/test_slime_hooks_train.py, written as for slime (slime's signatures,
slime's shapes); each records what it was given in CALLS."""
import torch

from slime.rollout.base_types import RolloutFnEvalOutput
from slime.utils.types import Sample

CALLS: list = []


# --custom-pg-loss-reducer-function-path: fn(total_lengths, response_lengths, loss_masks, calculate_per_token_loss)
def sum_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss=False):
    """Sums every masked token's loss (no per-sample mean)."""
    CALLS.append(("reducer", list(response_lengths), [m.tolist() for m in loss_masks], calculate_per_token_loss,
                  {m.dtype for m in loss_masks}))

    def reduce(x: torch.Tensor) -> torch.Tensor:
        return sum((x_i * m_i).sum() for x_i, m_i in zip(x.split(response_lengths, dim=0), loss_masks))
    return reduce


def constant_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss=False):
    """Dr.GRPO's: each sample's masked sum over a constant 4."""
    def reduce(x: torch.Tensor) -> torch.Tensor:
        return sum((x_i * m_i).sum() / 4.0 for x_i, m_i in zip(x.split(response_lengths, dim=0), loss_masks))
    return reduce


def reads_total_lengths(total_lengths, response_lengths, loss_masks, calculate_per_token_loss=False):
    prompt_lengths = [t - r for t, r in zip(total_lengths, response_lengths)]
    return lambda x: x.sum() / sum(prompt_lengths)


def slimes_default_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss=False):
    """What slime reduces with by default: its get_sum_of_sample_mean."""
    from slime.backends.megatron_utils.cp_utils import get_sum_of_sample_mean

    return get_sum_of_sample_mean(total_lengths, response_lengths, loss_masks, None, calculate_per_token_loss)


def tis_with_cp_helpers(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths,
                        response_lengths, **kwargs):
    """Written as slime's mis.py example: gathers with the CP helpers first (zipping total_lengths), then TIS."""
    from slime.backends.megatron_utils.cp_utils import all_gather_with_cp, slice_log_prob_with_cp

    full_old = [all_gather_with_cp(t, n, r) for t, n, r in zip(train_log_probs, total_lengths, response_lengths)]
    full_roll = [all_gather_with_cp(t, n, r) for t, n, r in zip(rollout_log_probs, total_lengths, response_lengths)]
    weights = [torch.exp(o - r).clamp(min=args.tis_clip_low, max=args.tis_clip) for o, r in zip(full_old, full_roll)]
    weights = torch.cat([slice_log_prob_with_cp(w, n, r) for w, n, r in zip(weights, total_lengths, response_lengths)])
    return pg_loss * weights, loss_masks, {}


# --custom-tis-function-path: fn(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs)
def clip_tis(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    """slime's vanilla TIS, clamped to [args.tis_clip_low, args.tis_clip]."""
    CALLS.append(("tis", pg_loss.shape, [t.tolist() for t in train_log_probs], [t.tolist() for t in rollout_log_probs],
                  [m.tolist() for m in loss_masks], sorted(kwargs), pg_loss.requires_grad,
                  {m.dtype for m in loss_masks}))
    ratio = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    weights = ratio.clamp(min=args.tis_clip_low, max=args.tis_clip)
    return pg_loss * weights, loss_masks, {"tis": ratio, "tis_clipfrac": (weights != ratio).float()}


def reject_above(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs):
    """Rejection sampling: tokens whose ratio exceeds args.tis_clip leave the loss (masks 0), weights 1."""
    ratio = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    keep = (ratio <= args.tis_clip).float()
    masks = [m * k for m, k in zip(loss_masks, keep.split([len(m) for m in loss_masks]))]
    return pg_loss, masks, {"rejected": 1.0 - keep}


# --custom-convert-samples-to-train-data-path: fn(args, samples) -> dict
def convert_rank(args, samples):
    """slime's train-data dict with rewards = the sample's index, and the first response token out of the loss."""
    CALLS.append(("convert", [(isinstance(s, Sample), s.index, s.get_reward_value(args)) for s in samples]))
    return {"tokens": [s.tokens for s in samples], "response_lengths": [s.response_length for s in samples],
            "rewards": [float(s.index) for s in samples], "raw_reward": [10.0 for _ in samples],
            "loss_masks": [[0] + [1] * (s.response_length - 1) for s in samples],
            "truncated": [0 for _ in samples], "sample_indices": [s.index for s in samples]}


def convert_drops_one(args, samples):
    out = convert_rank(args, samples)
    return {k: v[1:] for k, v in out.items()}


# --rollout-data-postprocess-path: fn(args, rollout_id, rollout_data) -> None
def double_advantages(args, rollout_id, rollout_data):
    """Records the dict's shape; doubles every advantage and takes the last token out of every loss mask."""
    CALLS.append(("postprocess", rollout_id, sorted(rollout_data),
                  [(t.dtype, len(t)) for t in rollout_data["tokens"]], list(rollout_data["response_lengths"]),
                  list(rollout_data["total_lengths"]), [a.tolist() for a in rollout_data["advantages"]]))
    rollout_data["advantages"] = [a * 2 for a in rollout_data["advantages"]]
    for m in rollout_data["loss_masks"]:
        m[-1] = 0


def cut_a_token(args, rollout_id, rollout_data):
    rollout_data["loss_masks"][0] = rollout_data["loss_masks"][0][:-1]


# --eval-function-path: fn(args, rollout_id, data_source, evaluation=False)
def eval_fixed(args, rollout_id, data_source, evaluation=False):
    CALLS.append(("eval", rollout_id, evaluation, type(data_source).__name__, list(args.eval_prompt_data)))
    return RolloutFnEvalOutput(data={"mine": {"rewards": [1.0, 0.0, 0.5, 0.5], "truncated": [1, 0, 0, 0]}},
                               metrics={"eval/extra": 7.0})


def eval_legacy(args, rollout_id, data_source, evaluation=False):
    return {"plain": {"rewards": [2.0, 4.0]}}


def eval_generates(args, rollout_id, data_source, evaluation=False):
    """Synchronous, as slime's: generates through args.sglang_router_* with slime's post, run on slime's loop."""
    from slime.utils.async_utils import run
    from slime.utils.http_utils import post

    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    outs = run(post(url, {"input_ids": [[1, 2, 3], [4, 5]], "return_logprob": True,
                          "sampling_params": {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True}}))
    lengths = [len(o["meta_info"]["output_token_logprobs"]) for o in outs]
    CALLS.append(("eval_generated", lengths))
    return {"gen": {"rewards": [float(n) for n in lengths], "truncated": [1 for _ in lengths]}}


def edit_in_place(args, rollout_id, rollout_data):
    rollout_data["advantages"][0][0] = 5.0
    rollout_data["returns"][1] = rollout_data["returns"][1] * 0
    rollout_data["loss_masks"][1][0] = 0


def recording_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss=False):
    """slime's default reduction, recording the lengths it was given."""
    CALLS.append(("lengths", [int(t) for t in total_lengths], list(response_lengths)))
    return lambda x: sum((x_i * m_i).sum() / m_i.sum().clamp(min=1)
                         for x_i, m_i in zip(x.split(response_lengths, dim=0), loss_masks))
