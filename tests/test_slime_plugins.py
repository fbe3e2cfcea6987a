"""slime's plug-ins run unchanged (docs/slime.md): a 3-argument custom generate posting SGLang /generate requests,
slime's Sample and DynamicFilterOutput, and `import slime` resolving to slick's stand-in only without slime.

Real parts: the in-process LocalEngine (a tiny random model), slick's SGLang front on a loopback port, aiohttp.
"""
import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slick.config import Config
from slick.configure.validate import validate_config
from slick.data.source import DataSource
from slick.engine.local import LocalEngine
from slick.reward.hub import RewardHub
from slick.rollout.filters import verdict
from slick.rollout.manager import RolloutManager
from slick.rollout.multiturn import get_tokenizer
from slick.rollout.slime_generate import takes_engine
from slick.types import Status

ROOT = Path(__file__).resolve().parents[1]


class Recorder:
    """The real engine, keeping (input ids, Generation) of every call."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, sampling, rid=None):
        gen = await self.engine.generate(prompt_ids, sampling, rid=rid)
        self.calls.append((list(prompt_ids), gen))
        return gen


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=8, seed=0)


def make_cfg(model_dir, **kw):
    base = dict(hf_checkpoint=str(model_dir), dtype="fp32", device="cpu", micro_batch_size=4, seed=7,
                rollout_batch_size=2, n_samples_per_prompt=2, rm_type="exact", rollout_max_response_len=12,
                apply_chat_template=True)
    base.update(kw)
    return validate_config(Config.from_flat(base), check_files=False)


def rows(tok):
    out = []
    for i, p in enumerate(["What is 12 + 30?", "Add 7 and 5, please.", "Name a prime.", "Say hi."]):
        text = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        out.append({"prompt_index": i, "prompt": p, "label": "42", "metadata": {}, "tools": None,
                    "prompt_ids": tok(text, add_special_tokens=False)["input_ids"]})
    return out


def rollout(cfg, engine):
    tok = get_tokenizer(cfg)
    rec = Recorder(engine)
    manager = RolloutManager(cfg, DataSource(rows(tok), cfg.n_samples_per_prompt), rec, RewardHub(cfg), tok)

    async def go():
        try:
            return await manager.generate_rollout(0)
        finally:
            await manager.close()
    groups, metrics = asyncio.run(go())
    return [s for g in groups for s in g], metrics, rec.calls, manager


def runs(mask, value):
    out, start = [], None
    for i, m in enumerate(list(mask) + [None]):
        if m == value and start is None:
            start = i
        elif m != value and start is not None:
            out.append((start, i))
            start = None
    return out


def test_slime_signature_is_told_from_slicks():
    async def slime_gen(args, sample, sampling_params, evaluation=False): ...
    async def slick_gen(args, sample, sampling_params, engine): ...
    assert not takes_engine(slime_gen) and takes_engine(slick_gen)


def test_search_style_generate_records_the_engines_tokens_and_logprobs(tiny_model_dir, engine):
    cfg = make_cfg(tiny_model_dir, custom_generate_function_path="tests.slime_plugins.generate")
    samples, metrics, calls, manager = rollout(cfg, engine)
    slime_plugins = sys.modules["tests.slime_plugins"]     # loaded by slick (its `import slime` needs the loader)
    assert len(samples) == 4 and len(calls) == 8                       # 4 samples x 2 turns, all through the engine
    ip, port, params = slime_plugins.SEEN[-1]
    assert ip == "127.0.0.1" and port == manager.slime.front.port and params["no_stop_trim"] is True
    assert params["max_new_tokens"] == 12 and "sampling_seed" in params
    version = asyncio.run(engine.get_weight_version())
    for s in samples:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.metadata["turns"] == 2
        trained = runs(s.loss_mask, 1)
        assert len(trained) == 2 and len(runs(s.loss_mask, 0)) == 1
        for a, b in trained:   # each trained run is one engine generation: its very tokens and logprobs
            gen = [g for _, g in calls if list(g.token_ids) == s.response_ids[a:b]]
            assert gen, (a, b)
            assert s.rollout_logprobs[a:b] == list(gen[0].logprobs)
        (a, b), = runs(s.loss_mask, 0)
        assert "<information>Doc 1: forty-two.</information>" in get_tokenizer(cfg).decode(s.response_ids[a:b])
        assert s.rollout_logprobs[a:b] == [0.0] * (b - a)
        assert len(s.response_ids) == len(s.rollout_logprobs) == len(s.weight_versions) == len(s.loss_mask)
        assert set(s.weight_versions) == {version} and s.reward in (0.0, 1.0)
    assert metrics["rollout/slime_unmatched_tokens"] == 0.0


@pytest.mark.parametrize("path", ["slime.rollout.sglang_rollout.generate", "tests.slime_plugins.generate_without_logprobs"])
def test_single_turn_generate_is_token_exact(tiny_model_dir, engine, path):
    """slime's own built-in generate (by its slime path), and one that drops the logprobs slick restores."""
    cfg = make_cfg(tiny_model_dir, custom_generate_function_path=path)
    tok = get_tokenizer(cfg)
    prompts = {tuple(r["prompt_ids"]) for r in rows(tok)}
    samples, metrics, calls, _ = rollout(cfg, engine)
    assert len(samples) == 4 and len(calls) == 4
    for s in samples:
        (inp, gen), = [(i, g) for i, g in calls if list(g.token_ids) == s.response_ids]
        assert tuple(s.prompt_ids) in prompts and inp == s.prompt_ids     # the prompt ids as tokenized by slick
        assert s.rollout_logprobs == list(gen.logprobs) and s.loss_mask == [1] * len(gen.token_ids)
        assert s.status == {"stop": Status.COMPLETED, "length": Status.TRUNCATED}[gen.finish_reason]
    assert metrics["rollout/slime_unmatched_tokens"] == 0.0


def test_filter_returning_keep_false_drops_every_group(tiny_model_dir, engine):
    cfg = make_cfg(tiny_model_dir, rollout_max_response_len=2,
                   dynamic_sampling_filter_path="tests.slime_plugins.drop_every_group")
    samples, metrics, calls, _ = rollout(cfg, engine)
    assert samples == []
    assert metrics["rollout/filtered_groups"] == metrics["rollout/dynamic_filter/drop_all"] > 0
    assert len(calls) == 2 * metrics["rollout/filtered_groups"]          # every generated group was dropped


def test_slime_filter_gets_slimes_sample_and_keeps(tiny_model_dir, engine):
    cfg = make_cfg(tiny_model_dir, rollout_max_response_len=2,
                   dynamic_sampling_filter_path="tests.slime_plugins.keep_if_reward_value")
    samples, metrics, _, _ = rollout(cfg, engine)
    assert len(samples) == 4 and metrics["rollout/filtered_groups"] == 0


def test_builtin_slime_filter_by_its_slime_path(tiny_model_dir, engine):
    """slime's check_reward_nonzero_std: the tiny model never writes "42", so every group has zero std."""
    cfg = make_cfg(tiny_model_dir, rollout_max_response_len=2, rollout_batch_size=1, over_sampling_batch_size=1,
                   dynamic_sampling_filter_path="slime.rollout.filter_hub.dynamic_sampling_filters"
                                                ".check_reward_nonzero_std")
    samples, metrics, _, _ = rollout(cfg, engine)
    assert samples == [] and metrics["rollout/dynamic_filter/drop_zero_std_0.0"] == metrics["rollout/filtered_groups"]


def test_verdict_reads_bools_and_slimes_result():
    from slick.compat.slime.rollout.filter_hub.base_types import DynamicFilterOutput as D

    assert verdict(True, remaining=5, want=2) == (True, None)
    assert verdict(False, remaining=5, want=2) == (False, None)
    assert verdict(D(keep=False, reason="r"), remaining=1, want=2) == (False, "r")
    assert verdict(D(keep=True), remaining=9, want=2) == (True, None)
    fallback = D(keep=False, reason="r", keep_when_insufficient=True)
    assert verdict(fallback, remaining=2, want=2) == (True, None)       # dropping it would need another round
    assert verdict(fallback, remaining=3, want=2) == (False, "r")
    with pytest.raises(TypeError, match="--dynamic-sampling-filter-path returned dict"):
        verdict({"keep": False}, remaining=1, want=1)


PROBE = textwrap.dedent("""
    import sys
    from slick.plugins import load_function
    fn = load_function("slime.utils.types.Sample", "--custom-generate-function-path")
    import slime.utils.types, slick.compat.slime.utils.types as stand_in
    print(fn.__module__, slime.utils.types is stand_in, getattr(sys.modules["slime"], "REAL", False))
""")


def test_import_slime_resolves_to_the_stand_in_only_without_slime(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["slick.compat.slime.utils.types", "True", "False"]
    real = tmp_path / "site" / "slime" / "utils"
    real.mkdir(parents=True)
    (real.parent / "__init__.py").write_text("REAL = True\n")
    (real / "__init__.py").write_text("")
    (real / "types.py").write_text("class Sample:\n    pass\n")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{tmp_path / 'site'}"
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["slime.utils.types", "False", "True"]   # the installed slime wins


def test_concurrent_first_samples_share_one_generate_front():
    """Eight first samples asking for the /generate front at once get one server, and close leaves no listener
    (each used to start its own; all but one were never closed)."""
    import psutil

    from slick.rollout.slime_generate import SGLangFront

    def listeners():
        return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}

    async def go():
        before = listeners()
        front = SGLangFront(lambda: None, None, set())
        ports = await asyncio.gather(*(front.start() for _ in range(8)))
        during = listeners() - before
        await front.close()
        return set(ports), during, listeners() - before

    ports, during, after = asyncio.run(go())
    assert len(ports) == 1 and during == ports and after == set()


HELPERS = textwrap.dedent("""
    import asyncio, threading
    from slick.plugins import load_function
    load_function("slime.utils.types.Sample", "probe")          # the stand-in answers for slime from here on
    from slime.utils.misc import load_function as slime_load
    from slime.utils.async_utils import run
    from slime.rollout.base_types import RolloutFnTrainOutput, RolloutFnEvalOutput, call_rollout_fn

    async def where():
        await asyncio.sleep(0.01)
        return threading.current_thread().name, id(asyncio.get_running_loop())

    first, second = run(where()), run(where())
    legacy = call_rollout_fn(lambda *a, evaluation: [["s"]], 1, evaluation=False)
    ev = call_rollout_fn(lambda *a, evaluation: {"aime": {}}, 1, evaluation=True)
    own = RolloutFnTrainOutput(samples=[], metrics={"m": 1})
    print(slime_load("os.path.join") is __import__("os").path.join, first == second, first[0],
          legacy.samples == [["s"]], isinstance(ev, RolloutFnEvalOutput), call_rollout_fn(
              lambda *a, evaluation: own, evaluation=False) is own)
""")


def test_slime_utility_modules_plug_ins_import():
    """slime.utils.misc.load_function, slime.utils.async_utils.run (one background loop for every call) and
    slime.rollout.base_types, as slime's plug-ins import them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", HELPERS], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "slime-async-utils", "True", "True", "True"]
