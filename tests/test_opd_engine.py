"""On-policy distillation with a teacher engine (--opd-type engine, slime's sglang), and the prompt logprobs it
rests on: slick's engine (in-process, and `slick serve`'s SGLang route through HttpEngine) scores given tokens as
the Hugging Face forward does; the engine teacher's logprobs equal the trainer-side teacher's for the same weights;
the OPD advantage terms are the hand-computed teacher - student differences; runs with either teacher agree; and
the mismatch probe now runs with slick's own engine. All in fp32, where the two forwards differ by rounding only
(measured: about 1e-6 in a logprob between slick's engine and the HF forward), so every bound below is 1e-4 or
tighter."""
import asyncio
import json
import sys
import textwrap
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.engine.local import LocalEngine
from slick.engines.client import HttpEngine
from slick.engines.router import launch_workers
from slick.algo.assemble import Advantages
from slick.loop.sync import train
from slick.models.tiny import make_tiny_model
from slick.algo.batch import TrainBatch
from slick.train.opd_teacher import EngineTeacher, response_logprobs
from slick.types import Sample

pytestmark = pytest.mark.timeout(600)
TOL = 1e-4          # fp32 logprobs of one model by two implementations (measured ~1e-6)
IDS = [1, 50, 300, 7, 4000, 12, 99, 5, 6, 21]
REWARD = textwrap.dedent('''
    def even_tokens(args, sample):
        ids = sample.response_ids
        return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)
''')


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A random model with the student's tokenizer, peakier than the student."""
    return make_tiny_model(tmp_path_factory.mktemp("teacher"), seed=7, initializer_range=0.3)


@pytest.fixture(scope="module")
def teacher_server(teacher_dir):
    (w,) = launch_workers(str(teacher_dir), 1, dtype="fp32", startup_timeout=240)
    yield w
    w.stop()


def _hf_logprobs(model_dir, ids) -> torch.Tensor:
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        return torch.log_softmax(m(torch.tensor([ids])).logits[0, :-1].float(), -1)


@pytest.mark.parametrize("threaded", [False, True])
def test_local_engine_prompt_logprobs_equal_the_hf_forward(teacher_dir, threaded):
    ref = _hf_logprobs(teacher_dir, IDS)

    async def main():
        eng = LocalEngine(teacher_dir, dtype="fp32", threaded=threaded)
        try:
            return await eng.prompt_logprobs(IDS, 4), await eng.prompt_top_logprobs(IDS, 3)
        finally:
            await eng.close()

    (token_lps, top), dicts = asyncio.run(main())
    assert len(token_lps) == len(top) == len(dicts) == len(IDS) - 1
    for i, lp in enumerate(token_lps):
        assert abs(lp - float(ref[i, IDS[i + 1]])) < TOL
        assert [t for t, _ in top[i]] == torch.topk(ref[i], 4).indices.tolist()   # most likely first
        assert set(dicts[i]) == set(torch.topk(ref[i], 3).indices.tolist()) | {IDS[i + 1]}
        assert all(abs(v - float(ref[i, t])) < TOL for t, v in dicts[i].items())


def _post(url, body) -> dict:
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def test_slick_serve_answers_sglang_prompt_logprobs(teacher_dir, teacher_server):
    ref = _hf_logprobs(teacher_dir, IDS)
    out = _post(teacher_server.url, {"input_ids": IDS, "return_logprob": True, "logprob_start_len": 0,
                                     "top_logprobs_num": 2, "sampling_params": {"max_new_tokens": 0}})
    meta = out["meta_info"]
    assert out["output_ids"] == [] and meta["input_token_logprobs"][0] == [None, IDS[0], None]
    assert [t for _, t, _ in meta["input_token_logprobs"]] == IDS
    assert all(abs(lp - float(ref[j - 1, IDS[j]])) < TOL for j, (lp, _, _) in enumerate(meta["input_token_logprobs"])
               if j)
    assert meta["input_top_logprobs"][0] is None
    assert [[t for _, t, _ in row] for row in meta["input_top_logprobs"][1:]] == \
        [torch.topk(ref[i], 2).indices.tolist() for i in range(len(IDS) - 1)]
    later = _post(teacher_server.url, {"input_ids": IDS, "return_logprob": True, "logprob_start_len": 4,
                                       "top_logprobs_num": 2, "sampling_params": {"max_new_tokens": 3,
                                                                                  "temperature": 0}})
    assert [t for _, t, _ in later["meta_info"]["input_token_logprobs"]] == IDS[4:]
    assert len(later["meta_info"]["output_top_logprobs"]) == len(later["output_ids"]) == 3
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(teacher_server.url, {"input_ids": IDS, "return_logprob": True, "logprob_start_len": len(IDS)})
    assert e.value.code == 400 and b"logprob_start_len must be an integer in [-1, 9]" in e.value.read()


def _samples() -> list:
    """Two student samples of one prompt; the second has a tool token (mask 0)."""
    prompt = IDS[:5]
    return [Sample(index=0, prompt_ids=prompt, response_ids=[33, 8, 901, 2], loss_mask=[1, 1, 1, 1],
                   rollout_logprobs=[-1.5, -0.25, -3.0, -0.75]),
            Sample(index=1, prompt_ids=prompt, response_ids=[77, 5000, 4, 12, 2], loss_mask=[1, 0, 1, 1, 1],
                   rollout_logprobs=[-2.0, -9.0, -0.5, -1.25, -0.125])]


def _cfg(student, tmp, run="r", **over):
    (tmp / "p.jsonl").write_text("".join(json.dumps({"prompt": f"q {i}: say something", "label": "x"}) + "\n"
                                         for i in range(8)))
    (tmp / "opd_engine_rm.py").write_text(REWARD)
    values = dict(hf_checkpoint=str(student), prompt_data=str(tmp / "p.jsonl"), rollout_batch_size=2,
                  n_samples_per_prompt=2, rollout_max_response_len=8, custom_rm_path="opd_engine_rm.even_tokens",
                  lr=1e-3, num_rollout=2, dtype="fp32", run_dir=str(tmp / run), no_progress=True, seed=3,
                  rollout_seed=5, micro_batch_size=4, no_rollout_store=True)
    values.update(over)
    return validate_config(Config.from_flat(values))


def test_engine_teacher_logprobs_equal_the_trainer_teacher(tiny_model_dir, teacher_dir, teacher_server, tmp_path):
    from slick.train.trainer import Trainer

    samples = _samples()
    trainer = Trainer(_cfg(tiny_model_dir, tmp_path, use_opd=True, opd_teacher_load=str(teacher_dir)))
    try:
        want = trainer.compute_logprobs(samples, "teacher")
    finally:
        trainer.close()

    async def main():
        local = EngineTeacher(LocalEngine(teacher_dir, dtype="fp32"))
        remote = EngineTeacher(HttpEngine([teacher_server.url]))
        try:
            return await local.score(samples), await remote.score(samples)
        finally:
            await local.close()
            await remote.close()

    for got in asyncio.run(main()):
        assert [len(g) for g in got] == [4, 5]
        assert max(float((g - w).abs().max()) for g, w in zip(got, want)) < TOL
    ref = _hf_logprobs(teacher_dir, IDS[:5] + [33, 8, 901, 2])
    assert abs(float(want[0][2]) - float(ref[6, 901])) < TOL   # response token 2 sits at position 5 + 2


def test_response_logprobs_read_the_token_that_follows():
    top = [{5: -0.5}, {6: -0.25, 9: -3.0}, {7: -2.0}]
    assert response_logprobs([4, 5, 6, 7], 2, top).tolist() == [-0.25, -2.0]
    with pytest.raises(ValueError, match="position 1 does not score the token that follows"):
        response_logprobs([4, 5, 8, 7], 2, top)


def test_opd_advantages_are_teacher_minus_student_by_hand(tiny_model_dir, teacher_dir, tmp_path):
    samples, rewards = _samples(), [1.0, 0.0]

    async def score():
        t = EngineTeacher(LocalEngine(teacher_dir, dtype="fp32"))
        try:
            return await t.score(samples)
        finally:
            await t.close()

    teacher = asyncio.run(score())
    batch = TrainBatch.from_samples(samples, rewards).with_columns(teacher_logprobs=teacher)
    raw = [[0.5 * (float(t) - s) if m else 0.0 for t, s, m in zip(tl, x.rollout_logprobs, x.loss_mask)]
           for tl, x in zip(teacher, samples)]
    # centred: the mean term over the batch's trained tokens is subtracted (slick.algo.distill, docs/distillation.md)
    trained = [v for r, x in zip(raw, samples) for v, m in zip(r, x.loss_mask) if m]
    mean = sum(trained) / len(trained)
    by_hand = [[v - mean if m else 0.0 for v, m in zip(r, x.loss_mask)] for r, x in zip(raw, samples)]
    assert abs(mean) > 0.1    # the centring changes these numbers
    opd = dict(use_opd=True, opd_type="engine", opd_teacher_load=str(teacher_dir), opd_kl_coef=0.5)
    only = Advantages.from_config(_cfg(tiny_model_dir, tmp_path, opd_only=True, **opd))(batch).advantages
    assert [x for a in only for x in a.tolist()] == pytest.approx([x for h in by_hand for x in h], abs=1e-6)
    assert only[1][1] == 0.0   # the tool token
    plain = Advantages.from_config(_cfg(tiny_model_dir, tmp_path)).compute(samples, rewards)
    joined = Advantages.from_config(_cfg(tiny_model_dir, tmp_path, **opd))(batch).advantages
    assert [x for a, p in zip(joined, plain) for x in (a - p).tolist()] == \
        pytest.approx([x for h in by_hand for x in h], abs=1e-6)


@pytest.fixture(scope="module")
def runs(tiny_model_dir, teacher_dir, teacher_server, tmp_path_factory):
    """Three 2-step OPD runs of one seed: the trainer's teacher, an in-process teacher engine, and the teacher
    served by `slick serve` (slime's spelling: --opd-type sglang)."""
    tmp = tmp_path_factory.mktemp("opd-runs")
    sys.path.insert(0, str(tmp))
    kinds = {"trainer": dict(opd_type="trainer", opd_teacher_load=str(teacher_dir)),
             "engine": dict(opd_type="engine", opd_teacher_load=str(teacher_dir)),
             "url": dict(opd_type="sglang", opd_teacher_url=teacher_server.url)}
    try:
        for name, kw in kinds.items():
            asyncio.run(train(_cfg(tiny_model_dir, tmp, name, use_opd=True, **kw)))
    finally:
        sys.path.remove(str(tmp))
    return {name: [json.loads(x) for x in (tmp / name / "metrics.jsonl").read_text().splitlines()]
            for name in kinds}


def test_runs_with_a_teacher_engine_equal_the_trainer_teacher_run(runs):
    """Step 1 samples the same tokens in every run (same seeds, same student), so its teacher logprob means agree
    to fp32 rounding; a wrong position or temperature would move them by far more than TOL."""
    first = {name: m[0] for name, m in runs.items()}
    for name in ("engine", "url"):
        for key in ("opd/teacher_logprob", "opd/student_logprob", "opd/kl", "train/loss"):
            assert abs(first[name][key] - first["trainer"][key]) < TOL, (name, key)
        assert len(runs[name]) == 2 and all(m["perf/teacher_time"] > 0 for m in runs[name])
    assert first["trainer"]["opd/kl"] > 0.5   # the teacher is far from the student: the term is not trivially 0


def test_local_engine_runs_log_the_mismatch_probe_near_zero_in_fp32(runs):
    """Engine and trainer hold the same fp32 weights at the probe: KL(engine || trainer) over the vocabulary is
    rounding only (measured ~1e-9; a logprob off by 1e-3 would already give ~1e-6). The probe runs at the first
    step and then every --mismatch-probe-interval (default 10) steps: not at the second."""
    first, second = runs["trainer"]
    assert 0 <= first["train/mismatch_kl_mean"] <= first["train/mismatch_kl_max"] < 1e-6, first
    assert first["perf/mismatch_probe_time"] > 0
    assert not any(k in second for k in ("train/mismatch_kl_mean", "perf/mismatch_probe_time")), second


def test_a_mismatch_probe_interval_below_one_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="--mismatch-probe-interval must be >= 1 .*got 0"):
        _cfg(tiny_model_dir, tmp_path, mismatch_probe_interval=0)


@pytest.mark.parametrize("over, words", [
    (dict(use_opd=True, opd_type="engine"), "--use-opd needs --opd-teacher-load TEACHER_DIR .* or --opd-teacher-url"),
    (dict(use_opd=True, opd_type="trainer", opd_teacher_url="http://127.0.0.1:1"),
     "--opd-teacher-url is a teacher server: it needs --opd-type engine"),
    (dict(use_opd=True, opd_type="sglang", opd_teacher_url="127.0.0.1:1"), "not an http:// or https:// URL"),
    (dict(opd_teacher_url="http://127.0.0.1:1"), "--opd-teacher-url needs --use-opd"),
    (dict(custom_rm_path="slime.rollout.on_policy_distillation.reward_func"),
     "slime's teacher-as-reward function; in slick the teacher scores through --use-opd --opd-type sglang"),
])
def test_teacher_engine_flags_are_refused_by_name(tiny_model_dir, tmp_path, over, words):
    with pytest.raises(ConfigError, match=words):
        _cfg(tiny_model_dir, tmp_path, **over)
