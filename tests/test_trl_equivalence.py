"""One slick optimizer step equals one TRL GRPOTrainer step (trl installed in the venv), in fp32.

Seam on the TRL side: ``GRPOTrainer.compute_loss(model, inputs)`` on prepared inputs (what its
``_generate_and_score_completions`` returns: prompt/completion ids and masks, advantages,
``num_items_in_batch``), then what ``transformers.Trainer`` does for one optimizer step with
``gradient_accumulation_steps=1``: backward, ``clip_grad_norm_(max_grad_norm)``, its AdamW, constant LR.
The slick side is the loop's own ``train_on_samples`` (advantages from the rewards, then ``train_step``).

Settings that make the two the same update (docs/training.md, "Reproducing TRL"): TRL's default
``loss_type="dapo"`` (masked token sum / tokens of the whole batch) = slick ``--calculate-per-token-loss``;
TRL's ``scale_rewards="group"`` = slick's GRPO advantages; ``max_grad_norm=1.0`` = ``--clip-grad 1.0``;
``beta=0`` = no KL; on-policy (``num_iterations=1``) so the clip range does not act; same temperature
(TRL scales the training logits by ``temperature`` as slick does with ``--rollout-temperature``).

Tolerances: TRL's group std gets ``+1e-4`` and slick's ``+1e-6`` before dividing, so advantages agree to
1e-3 relative (rewards 0/1, group std >= 0.5); both sides are then fed the same advantages. Logprobs agree
to 1e-5; gradients to 1e-5 of the largest entry (2e-4 at the second step, whose weights already differ by
the first step's rounding); the gradient norm to 1e-5 relative. Updated weights after each of two steps
(the second exercises AdamW's state), lr 1e-3: mean |difference| <= 1e-8, at most 0.1% of entries differ by
more than 1e-6, none by more than 5e-5 (AdamW's first update is g / (|g| + 1e-8): an entry whose gradient is
~1e-8 moves by a sensitive fraction of lr; a flipped update would differ by 2e-3). Measured: max 2.3e-5 on
one entry, mean 2e-10.
"""
import random

import pytest
import torch

pytest.importorskip("trl")

from slick.config import Config  # noqa: E402
from slick.configure.validate import validate_config  # noqa: E402
from slick.algo.assemble import objective_from_config  # noqa: E402
from slick.loop.step import train_on_samples
from slick.train.trainer import Trainer  # noqa: E402
from slick.types import Sample  # noqa: E402

G, PROMPTS, PLEN, MAXLEN, LR, TEMP = 4, 2, 6, 7, 1e-3, 0.7


def _batch(seed, pad_id):
    """PROMPTS groups of G completions (equal-length prompts: TRL left-pads, and HF positions would shift),
    completions of different lengths (right-padded on the TRL side), 0/1 rewards with spread in each group."""
    rng = random.Random(seed)
    prompts, comps, rewards = [], [], []
    for g in range(PROMPTS):
        p = [rng.randrange(100, 3000) for _ in range(PLEN)]
        for k in range(G):
            prompts.append(p)
            comps.append([rng.randrange(100, 3000) for _ in range(rng.randint(2, MAXLEN))])
            rewards.append(float((k + g + seed) % 2 if k < 2 else rng.random() < 0.5))
    return prompts, comps, rewards


def _trl_inputs(prompts, comps, advantages, pad_id):
    cid = torch.full((len(comps), MAXLEN), pad_id, dtype=torch.long)
    cmask = torch.zeros(len(comps), MAXLEN, dtype=torch.long)
    for i, c in enumerate(comps):
        cid[i, :len(c)] = torch.tensor(c)
        cmask[i, :len(c)] = 1
    return {"prompt_ids": torch.tensor(prompts), "prompt_mask": torch.ones(len(prompts), PLEN, dtype=torch.long),
            "completion_ids": cid, "completion_mask": cmask, "advantages": advantages,
            "num_items_in_batch": cmask.sum().float()}


def _trl_advantages(rewards):
    r = torch.tensor(rewards).view(-1, G)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)


def _slick_cfg(model_dir, per_token: bool):
    cfg = Config.from_flat(dict(
        hf_checkpoint=str(model_dir), dtype="fp32", device="cpu", lr=LR, clip_grad=1.0, weight_decay=0.0,
        rollout_temperature=TEMP, advantage_estimator="grpo", n_samples_per_prompt=G, rollout_batch_size=PROMPTS,
        micro_batch_size=3, calculate_per_token_loss=per_token, rm_type="exact", seed=0))
    return validate_config(cfg, check_files=False) or cfg


def _trl_trainer(model_dir, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, learning_rate=LR,
                      lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
                      per_device_train_batch_size=G * PROMPTS, gradient_accumulation_steps=1,
                      steps_per_generation=1, num_generations=G, num_iterations=1, beta=0.0,
                      temperature=TEMP, max_completion_length=MAXLEN, report_to="none", save_strategy="no",
                      seed=0, disable_tqdm=True)
    tr = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                     train_dataset=Dataset.from_list([{"prompt": "1 + 1 ="}] * 8), processing_class=tok)
    assert args.loss_type == "dapo" and args.scale_rewards == "group"   # TRL's defaults, what we reproduce
    tr.create_optimizer_and_scheduler(num_training_steps=2)
    tr.current_gradient_accumulation_steps = 1   # what Trainer's training loop sets for each accumulation window
    return tr, tok


def _trl_step(tr, inputs):
    model = tr.model
    model.train()
    loss = tr.compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tr.args.max_grad_norm)
    tr.optimizer.step()
    tr.lr_scheduler.step()
    tr.optimizer.zero_grad(set_to_none=True)
    return grads, float(norm)


def _slick_step(trainer, cfg, prompts, comps, rewards):
    samples = [Sample(index=i, group_index=i // G, prompt_ids=list(p), response_ids=list(c), loss_mask=[1] * len(c))
               for i, (p, c) in enumerate(zip(prompts, comps))]
    grads = {}

    def keep_grads(x):   # the loop's loss; the gradients are read after the step's backward via a hook below
        return loss_fn(x)
    loss_fn = objective_from_config(cfg)
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: grads.__setitem__(n, p.grad.detach().clone()))
             for n, p in trainer.model.named_parameters()]
    try:
        metrics, tensors = train_on_samples(cfg, trainer, samples, rewards, keep_grads, step=0)
    finally:
        for h in hooks:
            h.remove()
    return grads, metrics, tensors, samples


@pytest.mark.slow   # ~20 s of CPU (TRL and accelerate imports, three trainers); minutes on a shared machine
def test_one_and_two_steps_equal_trl(tiny_model_dir, tmp_path):
    trl_tr, tok = _trl_trainer(tiny_model_dir, tmp_path)
    cfg = _slick_cfg(tiny_model_dir, per_token=True)
    slick = Trainer(cfg)
    control_cfg = _slick_cfg(tiny_model_dir, per_token=False)   # slick's default normalisation
    control = Trainer(control_cfg)
    for step in range(2):
        prompts, comps, rewards = _batch(step, tok.pad_token_id)
        s_grads, metrics, tensors, samples = _slick_step(slick, cfg, prompts, comps, rewards)
        adv = torch.stack([a[0] for a in tensors["advantages"]])
        trl_adv = _trl_advantages(rewards)
        assert torch.allclose(adv, trl_adv, rtol=1e-3, atol=1e-6), (adv, trl_adv)
        if step == 0:   # logprobs before the step: TRL's fused head vs slick's packed forward
            inputs = _trl_inputs(prompts, comps, adv, tok.pad_token_id)
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
            am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
            with torch.no_grad():
                trl_lp, _, _ = trl_tr._get_per_token_logps_and_entropies(trl_tr.model, ids, am, MAXLEN)
            # (slick's weights have already taken step 0; the control trainer still has the initial ones)
            for i, lp in enumerate(control.compute_logprobs(samples)):
                assert torch.allclose(lp, trl_lp[i, :len(comps[i])], atol=1e-5, rtol=0)
        t_grads, t_norm = _trl_step(trl_tr, _trl_inputs(prompts, comps, adv, tok.pad_token_id))
        assert metrics["train/grad_norm"] == pytest.approx(t_norm, rel=1e-5)
        for n, g in t_grads.items():
            assert (s_grads[n] - g).abs().max() <= (1e-5 if step == 0 else 2e-4) * g.abs().max(), n
        s_w = dict(slick.model.named_parameters())
        d = torch.cat([(s_w[n].detach() - p.detach()).abs().flatten() for n, p in trl_tr.model.named_parameters()])
        stats = (float(d.max()), float((d > 1e-6).float().mean()), float(d.mean()))
        print(f"step {step}: updated weights |slick - TRL|: max {stats[0]:.2e}, >1e-6 on {stats[1]:.2e}, "
              f"mean {stats[2]:.2e}")
        assert stats[0] <= 5e-5 and stats[1] <= 1e-3 and stats[2] <= 1e-8, stats
        # the test can tell normalisations apart: slick's default (mean of per-sample means) moves differently
        train_on_samples(control_cfg, control, samples, rewards, objective_from_config(control_cfg), step=0)
        c_w = dict(control.model.named_parameters())
        assert max(float((c_w[n].detach() - p.detach()).abs().max())
                   for n, p in trl_tr.model.named_parameters()) > 1e-4
