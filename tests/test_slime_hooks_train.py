"""slime's train-side hooks, run with slime's arguments and shapes: the TIS function and the pg-loss reducer inside
the policy objective (slick/algo/slime_loss.py, checked against hand-computed losses), the samples-to-train-data
conversion and the rollout-data post-process in a real training step on the tiny model, and the eval function."""
import functools
import math
import pickle

import pytest
import torch

from slick.algo.inputs import LossInputs
from slick.algo.objective import compute_policy_objective
from slick.algo.slime_loss import SlimeLossHooks
from slick.compat.finder import install
from slick.config import Config

install()   # `import slime` in the plug-ins resolves to slick's stand-in, as when slick loads them
from tests import slime_train_hook_plugins as plug  # noqa: E402
from tests.algo_params import params  # noqa: E402
from tests.test_loop import prompts  # noqa: E402,F401  (a fixture: prompts and the even_rm reward)
from tests.test_slime_plugins import engine  # noqa: E402,F401  (the tiny model's LocalEngine)

ADV = torch.tensor([[1.0, 2.0, 9.0], [-1.0, 0.5, 3.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
LN2, LN4, LN12 = math.log(2.0), math.log(4.0), math.log(1.2)
ROLLOUT = torch.tensor([[-LN2, 0.0, 0.0], [LN4, 0.0, -LN12]])   # ratios exp(0 - r): [[2, 1, 1], [0.25, 1, 1.2]]


@pytest.fixture(autouse=True)
def fresh():
    plug.CALLS.clear()


def objective(**flags):
    """The run's objective (slick.algo.assemble.objective_from_config) for a default Config with ``flags``."""
    from slick.algo.assemble import objective_from_config

    return objective_from_config(Config.from_flat(flags))


def run(loss_fn, **kw):
    """On-policy (old = the logprobs, zeros): the policy loss per token is -A times the TIS weight."""
    logprobs = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = loss_fn(LossInputs(logprobs, None, MASK, ADV, rollout_logprobs=ROLLOUT, **kw))
    loss.backward()
    return loss, metrics, logprobs.grad


def test_sum_reducer_gives_the_masked_sum_over_the_steps_samples():
    fn = objective(custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.sum_reducer")
    assert isinstance(fn.keywords["slime"], SlimeLossHooks)
    assert pickle.loads(pickle.dumps(fn)).keywords["slime"].reducer is plug.sum_reducer   # to Ray trainer ranks
    loss, metrics, grad = run(fn, num_samples=4.0, num_tokens=10.0)
    # masked -A: (-1 - 2) + (1 - 0.5 - 3) = -5.5, over the step's 4 samples
    assert loss.item() == pytest.approx(-5.5 / 4) and metrics["pg_loss"] == pytest.approx(-1.375)
    assert torch.allclose(grad, -ADV * MASK / 4)
    ((kind, lengths, masks, per_token, dtypes),) = plug.CALLS
    assert (kind, lengths, masks, per_token, dtypes) == ("reducer", [2, 3], [[1, 1], [1, 1, 1]], False, {torch.int})
    # the default reduction of the same inputs: mean of per-sample means, (-1.5 - 2.5 / 3) / 4
    default, _, _ = run(objective(), num_samples=4.0, num_tokens=10.0)
    assert default.item() == pytest.approx((-1.5 - 2.5 / 3) / 4)


def test_reducer_in_token_mode_divides_by_the_steps_tokens():
    fn = objective(custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.constant_reducer",
                   calculate_per_token_loss=True)
    loss, _, _ = run(fn, num_samples=2.0, num_tokens=5.0)
    assert loss.item() == pytest.approx((-3.0 / 4 - 2.5 / 4) / 5)
    assert plug.CALLS == []
    fn = objective(custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.sum_reducer",
                   calculate_per_token_loss=True)
    loss, _, _ = run(fn)                                 # no global normaliser: this micro-batch's 5 tokens
    assert loss.item() == pytest.approx(-5.5 / 5) and plug.CALLS[0][3] is True


def test_clipping_tis_function_gives_the_predicted_loss_and_metrics():
    fn = objective(use_tis=True, tis_clip=1.5, tis_clip_low=0.5,
                   custom_tis_function_path="tests.slime_train_hook_plugins.clip_tis")
    loss, metrics, grad = run(fn, num_samples=2.0)
    # weights clamp([[2, 1, 1], [0.25, 1, 1.2]], 0.5, 1.5) = [[1.5, 1, -], [0.5, 1, 1.2]]
    s0, s1 = (-1 * 1.5 - 2 * 1) / 2, (1 * 0.5 - 0.5 * 1 - 3 * 1.2) / 3
    assert loss.item() == pytest.approx((s0 + s1) / 2)
    assert metrics["tis"] == pytest.approx(((2 + 1) / 2 + (0.25 + 1 + 1.2) / 3) / 2)
    assert metrics["tis_clipfrac"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert "tis_mean" not in metrics                  # slick's own TIS did not run as well
    w = torch.tensor([[1.5, 1.0, 0.0], [0.5, 1.0, 1.2]])
    assert torch.allclose(grad, -ADV * w / torch.tensor([[2.0], [3.0]]) / 2)
    ((kind, shape, old, roll, masks, kwargs, grad_flows, dtypes),) = plug.CALLS
    assert dtypes == {torch.int}                      # slime's loss masks are int tensors
    assert (kind, tuple(shape), old, masks) == ("tis", (5,), [[0.0, 0.0], [0.0, 0.0, 0.0]],
                                                [[1.0, 1.0], [1.0, 1.0, 1.0]])
    assert [r for row in roll for r in row] == pytest.approx([-LN2, 0.0, LN4, 0.0, -LN12])
    assert [len(row) for row in roll] == [2, 3]
    assert kwargs == ["response_lengths", "total_lengths"] and grad_flows is True
    # slime's vanilla TIS is slick's --use-tis at token level: the same loss
    builtin, _, _ = run(objective(use_tis=True, tis_clip=1.5, tis_clip_low=0.5), num_samples=2.0)
    assert builtin.item() == pytest.approx(loss.item())


def test_tis_function_masks_take_tokens_out_of_the_numerator_and_the_reducer():
    flags = dict(use_tis=True, tis_clip=1.5, custom_tis_function_path="tests.slime_train_hook_plugins.reject_above")
    loss, metrics, _ = run(objective(**flags), num_samples=2.0)
    # token (0, 0) (ratio 2) rejected; the denominators stay the original masks' (2 and 3 tokens)
    assert loss.item() == pytest.approx((-2 / 2 + (1 - 0.5 - 3) / 3) / 2)
    assert metrics["rejected"] == pytest.approx((1 / 2 + 0) / 2)
    loss, _, _ = run(objective(custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.sum_reducer",
                               **flags), num_samples=2.0)
    assert loss.item() == pytest.approx((-2 + 1 - 0.5 - 3) / 2)
    assert plug.CALLS[-1][2] == [[0.0, 1.0], [1.0, 1.0, 1.0]]       # the reducer got the function's masks


def test_hooks_get_the_samples_lengths_the_trainer_gives():
    """Sample 0: a 4-token prompt and a 3-token response whose last token is outside the loss mask; sample 1: a
    2-token prompt and 3 tokens. slime's total_lengths are [7, 5] and response_lengths [3, 3]."""
    fn = objective(custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.reads_total_lengths")
    loss, _, _ = run(fn, num_samples=2.0, prompt_lengths=[4, 2], response_lengths=[3, 3])
    # the reducer sums every packed token unmasked, sample 0's third too (-A: -1 - 2 - 9 + 1 - 0.5 - 3 = -14.5),
    # over the prompts' 4 + 2 tokens; slick divides by the step's 2 samples
    assert loss.item() == pytest.approx(-14.5 / 6 / 2)
    fn = objective(custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.sum_reducer")
    run(fn, num_samples=2.0, prompt_lengths=[4, 2], response_lengths=[3, 3])
    assert plug.CALLS[-1][1:3] == ([3, 3], [[1, 1, 0], [1, 1, 1]])


def test_the_trainer_gives_the_loss_hooks_each_samples_lengths(tiny_model_dir):
    from slick.algo.assemble import objective_from_config
    from slick.algo.batch import TrainBatch
    from slick.train.trainer import Trainer
    from tests.test_train import make_cfg, make_samples

    cfg = make_cfg(tiny_model_dir, micro_batch_size=2,
                   custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.recording_reducer")
    samples = make_samples(3, seed=2)
    adv = [torch.ones(len(s.response_ids)) for s in samples]
    Trainer(cfg).train_step(TrainBatch.from_samples(samples, [0.0] * 3, advantages=adv), objective_from_config(cfg))
    got = sorted((t, r) for kind, totals, responses in plug.CALLS for t, r in zip(totals, responses))
    assert len(plug.CALLS) == 2 and got == sorted((len(s.prompt_ids) + len(s.response_ids), len(s.response_ids))
                                                  for s in samples)


def test_a_hook_using_total_lengths_without_them_is_told_slick_has_none():
    fn = objective(custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.reads_total_lengths")
    with pytest.raises(ValueError, match="--custom-pg-loss-reducer-function-path: slick gives no total_lengths"):
        run(fn)


@pytest.mark.parametrize("per_token", [False, True])
def test_slimes_own_reducer_gives_slicks_default_loss(per_token):
    """A reducer returning slime's get_sum_of_sample_mean (from slime's module path) trains on slick's default."""
    fn = objective(custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.slimes_default_reducer",
                   calculate_per_token_loss=per_token)
    loss, _, grad = run(fn, num_samples=3.0, num_tokens=7.0)
    default, _, default_grad = run(objective(calculate_per_token_loss=per_token), num_samples=3.0, num_tokens=7.0)
    assert loss.item() == pytest.approx(default.item()) and torch.allclose(grad, default_grad)
    assert loss.item() == pytest.approx(-5.5 / 7 if per_token else (-1.5 - 2.5 / 3) / 3)


def test_tis_written_with_slimes_cp_helpers_runs_as_in_slime():
    """slime's mis.py pattern: zip total_lengths into the context-parallel helpers, which slick offers for one
    rank; the loss is the clamped-weight one."""
    flags = dict(use_tis=True, tis_clip=1.5, tis_clip_low=0.5)
    loss, _, _ = run(objective(custom_tis_function_path="tests.slime_train_hook_plugins.tis_with_cp_helpers",
                               **flags), num_samples=2.0)
    builtin, _, _ = run(objective(**flags), num_samples=2.0)
    assert loss.item() == pytest.approx(builtin.item())
    assert loss.item() == pytest.approx(((-1 * 1.5 - 2) / 2 + (0.5 - 0.5 - 3 * 1.2) / 3) / 2)


def test_loss_hooks_keep_zero_advantage_samples_in_the_batch():
    from slick.algo.batch import TrainBatch
    from slick.loop.step import without_zero_gradients
    from slick.types import Sample

    samples = [Sample(index=i, group_index=0, prompt="p", prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 1])
               for i in range(2)]
    part = TrainBatch.from_samples(samples, [0.0, 1.0]).with_columns(
        advantages=[torch.zeros(2), torch.ones(2)])
    cfg = Config.from_flat(dict(custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.sum_reducer"))
    fn = objective(custom_pg_loss_reducer_function_path="tests.slime_train_hook_plugins.sum_reducer")
    assert without_zero_gradients(cfg, fn, part) == (part, fn)
    plain = functools.partial(compute_policy_objective, params())
    kept, _ = without_zero_gradients(Config.from_flat({}), plain, part)
    assert len(kept) == 1


@pytest.mark.parametrize("argv,problem", [
    (["--custom-tis-function-path", "a.b"], "is called only with --use-tis"),
    (["--custom-tis-function-path", "a.b", "--use-tis", "--tis-level", "sequence"], "drop --tis-level sequence"),
    (["--custom-pg-loss-reducer-function-path", "a.b", "--custom-loss-function-path", "c.d"],
     "which --custom-loss-function-path replaces"),
    (["--custom-convert-samples-to-train-data-path", "a.b", "--custom-reward-post-process-path", "c.d"],
     "replaces slime's reward post-process"),
])
def test_hook_flags_refused_where_slime_would_not_call_them(argv, problem):
    from slick.config import ConfigError
    from slick.configure import parse_config

    with pytest.raises(ConfigError, match=problem):
        parse_config(argv, validate=False)


def test_hook_flags_parse_by_slimes_names():
    from slick.configure import parse_config

    cfg = parse_config(["--custom-convert-samples-to-train-data-path", "a.b", "--rollout-data-postprocess-path",
                        "c.d", "--eval-function-path", "e.f", "--use-tis", "--custom-tis-function-path", "g.h",
                        "--custom-pg-loss-reducer-function-path", "i.j"], validate=False)
    assert (cfg.custom_convert_samples_to_train_data_path, cfg.rollout_data_postprocess_path,
            cfg.eval_function_path, cfg.custom_tis_function_path, cfg.custom_pg_loss_reducer_function_path) == \
        ("a.b", "c.d", "e.f", "g.h", "i.j")
    assert cfg.disable_rewards_normalization is True     # slime normalises in the conversion the function replaces
    default = parse_config(["--eval-function-path", "slime.rollout.sglang_rollout.generate_rollout"], validate=False)
    assert default.eval_function_path is None            # slime's default eval rollout: slick's own evaluation


def loop_run(tiny_model_dir, prompts, tmp_path, **flags):
    """One training step of slick train on the tiny model with ``flags``; (debug train rows, metrics rows)."""
    import asyncio
    import json

    from slick.loop.sync import train
    from tests.test_loop import make_cfg as loop_cfg

    cfg = loop_cfg(tiny_model_dir, prompts, tmp_path / "run", num_rollout=1, rollout_max_response_len=4,
                   save_debug_train_data=str(tmp_path / "dbg"), **flags)
    asyncio.run(train(cfg))
    rows = [json.loads(x) for x in (tmp_path / "dbg" / "train_0.jsonl").read_text().splitlines()]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return rows, metrics


def test_convert_and_postprocess_set_what_the_step_trains_on(tiny_model_dir, prompts, tmp_path):  # noqa: F811
    """--custom-convert-samples-to-train-data-path: called with the step's slime Samples; its rewards (the sample
    index) are GRPO's advantages and its loss masks are trained with. --rollout-data-postprocess-path: called after
    the advantages with slime's dict; the doubled advantages and the masks it cut are trained on."""
    rows, metrics = loop_run(tiny_model_dir, prompts, tmp_path, disable_rewards_normalization=True,
                             custom_convert_samples_to_train_data_path="tests.slime_train_hook_plugins.convert_rank",
                             rollout_data_postprocess_path="tests.slime_train_hook_plugins.double_advantages")
    (convert,) = [c for c in plug.CALLS if c[0] == "convert"]
    assert [(is_slime, i) for is_slime, i, _ in convert[1]] == [(True, i) for i in range(8)]
    (post,) = [c for c in plug.CALLS if c[0] == "postprocess"]
    _, rollout_id, keys, tokens, lengths, totals, seen_adv = post
    assert rollout_id == 0
    assert {"tokens", "response_lengths", "total_lengths", "loss_masks", "rewards", "advantages", "returns",
            "sample_indices", "truncated", "rollout_log_probs"} <= set(keys)
    assert "log_probs" not in keys                   # one on-policy optimizer step: no old logprobs, as in slime
    assert [dt for dt, _ in tokens] == [torch.long] * 8
    assert lengths == [len(r["response_ids"]) for r in rows]
    assert [n for _, n in tokens] == totals and all(t > n for t, n in zip(totals, lengths))
    for r, adv in zip(rows, seen_adv):
        assert r["reward"] == r["index"]                               # the function's rewards
        assert adv == [0.0] + [float(r["index"])] * (len(adv) - 1)   # GRPO: the reward, on the loss tokens
        assert r["advantages"] == pytest.approx([2.0 * a for a in adv])  # the post-process doubled them
        n = len(r["response_ids"])
        assert r["loss_mask"] == ([0] + [1] * (n - 1))[:n - 1] + [0]    # convert cut the first, post the last
    assert metrics[0]["train/slime_raw_reward"] == 10.0
    # the trained loss tokens (sample 0, all advantages 0, is left out of the forward: slick/loop/step.py)
    assert metrics[0]["train/response_tokens"] == sum(max(len(r["response_ids"]) - 2, 0) for r in rows[1:])


class _Tok:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def _samples():
    from slick.types import Sample

    return [Sample(index=i, group_index=0, prompt="p", prompt_ids=[1, 2], response_ids=[3, 4, 5], loss_mask=[1, 1, 1],
                   reward=float(i)) for i in range(2)]


def test_convert_must_keep_every_sample_and_postprocess_every_token():
    from slick.algo.batch import TrainBatch
    from slick.loop.slime_data import SlimeTrainData

    cfg = Config.from_flat({})
    drops = SlimeTrainData(cfg, _Tok(), plug.convert_drops_one, None)
    with pytest.raises(ValueError, match="'tokens' has 1 entries for 2 samples"):
        drops.convert_samples(_samples(), [0.0, 1.0])
    ok = SlimeTrainData(cfg, _Tok(), plug.convert_rank, None)
    samples = _samples()
    assert ok.convert_samples(samples, [5.0, 5.0]) == ([0.0, 1.0], {"train/slime_raw_reward": 10.0})
    assert [s.loss_mask for s in samples] == [[0, 1, 1], [0, 1, 1]]
    cut = SlimeTrainData(cfg, _Tok(), None, plug.cut_a_token)
    batch = TrainBatch.from_samples(_samples(), [0.0, 1.0]).with_columns(advantages=[torch.ones(3), torch.ones(3)])
    with pytest.raises(ValueError, match=r"rollout_data\['loss_masks'\] has an entry of 2 values for a 3-token"):
        cut.postprocess_batch(batch, 0)


def test_eval_function_runs_in_place_of_slicks_evaluation(tiny_model_dir, prompts, tmp_path):  # noqa: F811
    rows, metrics = loop_run(tiny_model_dir, prompts, tmp_path, eval_interval=1,
                             eval_prompt_data=["held", str(prompts)],
                             eval_function_path="tests.slime_train_hook_plugins.eval_fixed")
    evals = [c for c in plug.CALLS if c[0] == "eval"]
    assert evals == [("eval", 0, True, "DataSource", ["held", str(prompts)])] * 2   # before step 1 and after it
    for m in metrics:
        assert (m["eval/mine"], m["eval/mine-truncated_ratio"], m["eval/extra"]) == (0.5, 0.25, 7.0)
        assert not any(k.startswith("eval/held") for k in m)
    from slick.loop.slime_eval import eval_metrics
    assert eval_metrics(plug.eval_legacy(None, 0, None)) == {"eval/plain": 3.0}


def test_eval_function_generates_through_the_sglang_front(tiny_model_dir, engine):  # noqa: F811
    """A synchronous slime eval function posts to args.sglang_router_* from its worker thread while the front runs
    on the event loop: the engine answers."""
    import asyncio
    from types import SimpleNamespace

    from slick.loop.slime_eval import SlimeEval
    from slick.models.tokenizer import load_tokenizer

    cfg = Config.from_flat(dict(hf_checkpoint=str(tiny_model_dir),
                                eval_function_path="tests.slime_train_hook_plugins.eval_generates"))
    slime_eval = SlimeEval.from_config(cfg, load_tokenizer(str(tiny_model_dir)))
    metrics = asyncio.run(slime_eval(SimpleNamespace(engine=engine, data=None), 3))
    assert plug.CALLS == [("eval_generated", [3, 3])]
    assert (metrics["eval/gen"], metrics["eval/gen-truncated_ratio"]) == (3.0, 1.0)


@pytest.mark.parametrize("flag", ["--eval-function-path", "--rollout-data-postprocess-path",
                                  "--custom-convert-samples-to-train-data-path",
                                  "--custom-pg-loss-reducer-function-path", "--custom-tis-function-path"])
def test_slime_check_reports_the_hooks_as_slicks_own_flags(flag):
    from slick.config import slime_table
    from slick.configure.parse import build_parser
    from slick.configure.slime_check import verdict

    assert verdict(flag, set(build_parser()._option_string_actions))[0] == "same"
    assert flag not in slime_table.REFUSED


def test_postprocess_changes_in_place_and_critic_returns_are_trained_on():
    from slick.algo.batch import TrainBatch
    from slick.loop.slime_data import SlimeTrainData

    batch = TrainBatch.from_samples(_samples(), [0.0, 1.0]).with_columns(
        advantages=[torch.ones(3), torch.full((3,), 2.0)], returns=[torch.ones(3), torch.full((3,), 3.0)],
        values=[torch.zeros(3), torch.zeros(3)])
    out = SlimeTrainData(Config.from_flat({}), _Tok(), None, plug.edit_in_place).postprocess_batch(batch, 4)
    assert [a.tolist() for a in out.advantages] == [[5.0, 1.0, 1.0], [2.0, 2.0, 2.0]]
    assert [r.tolist() for r in out.returns] == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert out.loss_mask == [[1, 1, 1], [0, 1, 1]]
    assert [a.tolist() for a in batch.advantages] == [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]   # the input batch as it was
