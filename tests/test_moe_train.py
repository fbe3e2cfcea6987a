"""Mixture-of-experts models in the trainer (Mixtral, Qwen3-MoE) and routing replay from slick's engine (fp32)."""
import json

import pytest
import torch

from slick.algo.routing import decode_routing
from slick.engine.local import LocalEngine
from slick.train.trainer import Trainer
from slick.types import Sample, SamplingParams
from tests.test_engine_local import run
from tests.test_moe_engine import CASES, spiky_moe
from tests.test_train import make_cfg, reference_logprobs, simple_loss
from tests.batches import batch_of

BOUND = 1e-4   # fp32: max |trainer logprob - reference logprob|


def engine_samples(d, prompts, n=2, max_new=10, seed=0):
    """``n`` sampled responses per prompt from slick's engine on model ``d``, as samples with their routing."""
    eng = LocalEngine(d, dtype="fp32")
    eng.eos_ids = []
    out = []
    try:
        for i, text in enumerate(prompts):
            p = eng.tokenizer.encode(text)
            for j in range(n):
                sp = SamplingParams(temperature=1.0, max_new_tokens=max_new, stop_token_ids=[], seed=seed + 10 * i + j)
                s = Sample(index=len(out), group_index=i, prompt_ids=p)
                s.apply_generation(run(eng.generate(p, sp)))
                out.append(s)
    finally:
        eng.close_sync()
    return out


PROMPTS = ["Hello there, how are you doing today?", "What is 3 + 4?", "1 2 3 4 5"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_trainer_logprobs_equal_hf(tmp_path, case):
    d, m = spiky_moe(tmp_path, case)
    tr = Trainer(make_cfg(d))
    assert tr.moe is not None and tr.fused_layers == 0
    samples = engine_samples(d, PROMPTS[:2])          # two samples per prompt: packed with a shared prompt
    lps = tr.compute_logprobs(samples)
    for s, lp in zip(samples, lps):
        assert (lp - reference_logprobs(m, s)).abs().max().item() < BOUND
        # the engine's logprobs (KV cache, grouped experts) agree too
        assert (lp - torch.tensor(s.rollout_logprobs)).abs().max().item() < BOUND


def test_engine_records_routing_of_every_input_token(tmp_path):
    d, m = spiky_moe(tmp_path, "qwen3_moe_raw_sparse")
    samples = engine_samples(d, PROMPTS[:2], n=3)
    for s in samples:
        ids = decode_routing(s.routed_experts)
        assert ids.dtype == torch.uint8
        assert tuple(ids.shape) == (len(s.prompt_ids) + len(s.response_ids) - 1, 1, 2)   # 1 MoE layer, top-2
    # the routing survives the sample's JSON round trip (buffer, rollout store, checkpoints hold to_dict)
    back = Sample.from_dict(json.loads(json.dumps(samples[0].to_dict())))
    assert torch.equal(decode_routing(back.routed_experts), decode_routing(samples[0].routed_experts))
    assert "routed_experts" not in Sample(index=1).to_dict()   # dense samples keep their old record


def test_replayed_routing_is_the_trainers_own_under_the_same_weights(tmp_path):
    """Engine and trainer with the same weights: the recorded experts equal the trainer's own top-k at every
    replayed token (mismatch exactly 0), so recording and the packed layout line up."""
    d, m = spiky_moe(tmp_path, "mixtral")
    samples = engine_samples(d, PROMPTS)
    tr = Trainer(make_cfg(d, use_routing_replay=True))
    lps = tr.compute_logprobs(samples)
    met = tr.moe.pop_metrics()
    assert met["moe/mismatch"] == 0.0 and met["moe/replay_missing_samples"] == 0.0
    for s, lp in zip(samples, lps):
        assert (lp - torch.tensor(s.rollout_logprobs)).abs().max().item() < BOUND


def perturbed_router_copy(tmp_path, d, m):
    """Model ``d`` with every router redrawn: the trainer's own top-k then differs from the engine's."""
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.25)
    out = tmp_path / "perturbed"
    m.save_pretrained(out)
    for f in d.glob("tokenizer*"):
        (out / f.name).write_bytes(f.read_bytes())
    for f in ("special_tokens_map.json", "chat_template.jinja"):
        if (d / f).exists():
            (out / f).write_bytes((d / f).read_bytes())
    return out


def test_replay_makes_trainer_logprobs_equal_the_engines(tmp_path):
    """Top-1 Mixtral (its renormalised gate weight is exactly 1): the engine samples with model A; the trainer holds
    A with different routers, so its own router sends tokens elsewhere. Without replay its logprobs are far from
    the engine's; with replay they are equal within fp32 rounding."""
    d, m = spiky_moe(tmp_path, "mixtral", num_experts_per_tok=1)
    samples = engine_samples(d, PROMPTS)
    b = perturbed_router_copy(tmp_path, d, m)
    engine_lp = [torch.tensor(s.rollout_logprobs) for s in samples]

    def gap(replay):
        tr = Trainer(make_cfg(b, use_routing_replay=replay))
        lps = tr.compute_logprobs(samples)
        return max((a - e).abs().max().item() for a, e in zip(lps, engine_lp)), tr.moe.pop_metrics()

    off, off_m = gap(False)
    on, on_m = gap(True)
    assert off_m["moe/mismatch"] > 0.3 and on_m["moe/mismatch"] > 0.3   # its own router disagrees on many tokens
    assert off > 0.1                            # so without replay it scores other computations
    assert on < BOUND                           # with replay, the engine's
    print(f"max |trainer - engine| logprob: {off:.3g} without replay, {on:.2g} with; "
          f"mismatch {off_m['moe/mismatch']:.2f} / {on_m['moe/mismatch']:.2f}")


def test_train_step_reports_moe_metrics_and_router_learns(tmp_path):
    d, m = spiky_moe(tmp_path, "qwen3_moe_norm")
    samples = engine_samples(d, PROMPTS[:2])
    tr = Trainer(make_cfg(d, use_routing_replay=True, lr=1e-2))
    router = dict(tr.model.named_parameters())["model.layers.0.mlp.gate.weight"]
    before = router.detach().clone()
    adv = [torch.full((len(s.response_ids),), 1.0 if i % 2 else -1.0) for i, s in enumerate(samples)]
    out = tr.train_step(batch_of(samples, adv), simple_loss)
    for k in ("load_max", "load_mean", "entropy", "mismatch"):
        for j in range(2):
            assert f"moe/{k}/layer{j}" in out
    n_tokens = sum(len(s.prompt_ids) + len(s.response_ids) - 1 for s in samples[::2]) + \
        sum(len(s.response_ids) - 1 for s in samples[1::2])   # shared prompts are packed once
    assert out["moe/load_mean/layer0"] == pytest.approx(n_tokens * 2 / 4)   # k tokens-slots over 4 experts
    assert out["moe/load_max/layer0"] >= out["moe/load_mean/layer0"]
    assert 0.0 < out["moe/entropy"] <= torch.log(torch.tensor(4.0)).item() + 1e-6
    assert out["moe/mismatch"] == 0.0
    assert not torch.equal(router.detach(), before)   # the router trains through its gate weights


def test_hf_export_and_checkpoint_round_trip(tmp_path):
    """A trained MoE policy exports to a directory plain transformers (and slick's engine) load with the same
    logits, and a checkpoint restores its weights exactly."""
    from transformers import AutoModelForCausalLM

    from slick.engine.model import Transformer
    from slick.ckpt.checkpoint import load_checkpoint, save_checkpoint, save_hf

    d, m = spiky_moe(tmp_path, "qwen3_moe_raw_sparse")
    samples = engine_samples(d, PROMPTS[:2])
    tr = Trainer(make_cfg(d, lr=1e-2))
    adv = [torch.full((len(s.response_ids),), 1.0 if i % 2 else -1.0) for i, s in enumerate(samples)]
    tr.train_step(batch_of(samples, adv), simple_loss)
    out = save_hf(tmp_path / "hf", tr)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(hf).__name__ == "Qwen3MoeForCausalLM"
    ids = torch.tensor([samples[0].prompt_ids + samples[0].response_ids])
    with torch.no_grad():
        ref = m(ids).logits
        got = hf(ids).logits
        tr.model.eval()
        mine = tr.model(ids).logits
    assert (got - mine).abs().max().item() < BOUND and (got - ref).abs().max().item() > 1e-3   # trained, exported
    eng = Transformer.load(out, torch.float32, torch.device("cpu"))
    assert eng.layers[1].moe is not None and eng.layers[0].moe is None
    ck = save_checkpoint(tmp_path / "ck", 1, tr, {"step": 1})
    assert ck.is_dir()
    tr2 = Trainer(make_cfg(d, lr=1e-2))
    load_checkpoint(tmp_path / "ck", tr2)
    for (n, a), (_, b) in zip(tr.model.named_parameters(), tr2.model.named_parameters()):
        assert torch.equal(a, b), n


def test_routing_survives_buffer_state_and_staleness(tmp_path):
    """Samples with routing pass through the rollout buffer (a stale-but-allowed group in async, a buffer saved
    in a checkpoint and resumed) with their routing intact."""
    from slick.data.buffer import RolloutBuffer

    d, _ = spiky_moe(tmp_path, "mixtral")
    samples = engine_samples(d, PROMPTS[:2])
    for s in samples:
        s.weight_versions = [0] * len(s.response_ids)
    buf = RolloutBuffer(max_staleness=1)
    buf.put([samples[:2], samples[2:]])
    resumed = RolloutBuffer(max_staleness=1)
    resumed.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    taken = [s for g in resumed.take(2, current_version=1) for s in g]   # one version behind: kept
    assert [s.index for s in taken] == [s.index for s in samples]
    for a, b in zip(samples, taken):
        assert torch.equal(decode_routing(a.routed_experts), decode_routing(b.routed_experts))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_replay_refused_with_engines_that_return_no_routing(tmp_path, engine):
    from slick.config import Config, ConfigError
    from slick.configure.validate import validate_config

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x"}\n')
    cfg = Config.from_flat({"prompt_data": str(data), "hf_checkpoint": str(tmp_path), "rollout_engine": engine,
                            "rollout_urls": ["http://127.0.0.1:1"], "use_routing_replay": True})
    with pytest.raises(ConfigError) as e:
        validate_config(cfg, check_files=False)
    assert any("--use-routing-replay" in p and f"--rollout-engine {engine} does not return them" in p
               for p in e.value.problems), e.value.problems


def test_interrupted_generation_keeps_the_routing_of_its_last_request():
    """A generation resubmitted after a pause (rollout/interrupt.py) is rebuilt from its pieces; the last piece's
    prompt held every earlier token, so its routing covers the whole sequence and is the one kept."""
    from slick.algo.routing import encode_routing
    from slick.engines.fault import PartialGeneration
    from slick.types import Generation

    first = Generation([5, 6], [-1.0, -1.0], "abort", routed_experts=encode_routing(torch.zeros(3, 1, 2)))
    last = Generation([7], [-1.0], "stop", routed_experts=encode_routing(torch.ones(4, 1, 2)))
    acc = PartialGeneration()
    acc.add(first)
    acc.add(last)
    out = acc.result(last, prompt_len=2)
    assert out.token_ids == [5, 6, 7]
    assert torch.equal(decode_routing(out.routed_experts), torch.ones(4, 1, 2, dtype=torch.uint8))


def test_replay_accepted_with_slick_serve_over_http(tmp_path):
    """slick serve returns routed experts (tests/test_moe_http.py): --rollout-engine http passes the check."""
    from slick.config import Config
    from slick.configure.validate import validate_config

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x"}\n')
    cfg = Config.from_flat({"prompt_data": str(data), "hf_checkpoint": str(tmp_path), "rollout_engine": "http",
                            "rollout_urls": ["http://127.0.0.1:1"], "use_routing_replay": True})
    assert validate_config(cfg, check_files=False).use_routing_replay
