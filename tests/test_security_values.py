"""Bad values refused by name before anything runs on them (docs/security.md, "Bad values"): LoRA rank and alpha
(slick/configure/lora.py), adapter directories checked for method, rank, alpha, tensor names and shapes by one
function (slick/models/adapter_check.py) on every path: --lora-load at start-up and in the trainer, and a real
`slick serve`'s /update_weights_from_disk, which answers 400 and keeps the weights it had."""
import asyncio
import json
import math
import struct
from pathlib import Path

import pytest
import torch

from slick.config.config import ConfigError
from slick.configure.parse import parse_config
from slick.engine.local import LocalEngine
from slick.engine.weight_check import WeightUpdateError
from slick.engines.client import EngineError, HttpEngine
from slick.engines.router import launch_workers
from slick.types import SamplingParams

pytestmark = pytest.mark.timeout(300)
TARGETS = ["q_proj", "v_proj"]


def _refusal(model_dir, *flags, check_files=True) -> str:
    argv = ["--hf-checkpoint", str(model_dir), "--rm-type", "exact", "--dtype", "fp32", *flags]
    with pytest.raises(ConfigError) as e:
        parse_config(argv)
    return "\n".join(e.value.problems)


# ---------------------------------------------------------------------------------------------- flags
@pytest.mark.parametrize("alpha", ["nan", "inf", "-inf", "1e308", "0"])
def test_lora_alpha_must_be_finite_and_in_range(tiny_model_dir, alpha):
    out = _refusal(tiny_model_dir, "--lora-rank", "4", f"--lora-alpha={alpha}")
    assert f"--lora-alpha must be a finite number in (0, 65536], got {float(alpha)!r}" in out


@pytest.mark.parametrize("rank", ["-1", "65537", str(10 ** 20)])
def test_lora_rank_out_of_range_is_refused_by_name(tiny_model_dir, rank):
    from slick.config.config import Config
    from slick.configure.validate import validate_config

    cfg = Config.from_flat(dict(hf_checkpoint=str(tiny_model_dir), rm_type="exact", dtype="fp32", lora_rank=int(rank)))
    with pytest.raises(ConfigError) as e:      # without the model at hand too (check_files=False)
        validate_config(cfg, check_files=False)
    out = "\n".join(e.value.problems)
    assert (f"--lora-rank must be an integer in [1, 65536], got {rank}" in out if rank != "-1"
            else "--lora-rank must be >= 0 (0 = full fine-tuning), got -1" in out)


# ---------------------------------------------------------------------------------------------- adapters
def make_adapter(model_dir, out, *, config=None, tensors=None, std=0.1):
    """A real PEFT LoRA adapter (rank 4 on q_proj, v_proj) of the tiny model, B nudged; ``config`` / ``tensors``:
    edits to its adapter_config.json / state dict (a value None drops the entry)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    peft.save_pretrained(str(out))
    if config:
        conf = json.loads((out / "adapter_config.json").read_text())
        conf.update(config)
        (out / "adapter_config.json").write_text(json.dumps(conf))    # NaN as JSON's NaN, as Python writes it
    if tensors:
        from safetensors.torch import load_file, save_file

        sd = load_file(str(out / "adapter_model.safetensors"))
        for k, v in tensors.items():
            name = next(n for n in sd if k in n)
            if v is None:
                del sd[name]
            else:
                sd[name] = v
        save_file(sd, str(out / "adapter_model.safetensors"))
    return out


BAD_ADAPTERS = {   # name: (edits, what the refusal names)
    "alpha_nan": (dict(config={"lora_alpha": float("nan")}), "adapter_config.json: field 'lora_alpha' must be a "
                  "finite number in (0, 65536], got nan"),
    "alpha_1e30": (dict(config={"lora_alpha": 1e30}), "field 'lora_alpha' must be a finite number in (0, 65536], "
                   "got 1e+30"),
    "dora": (dict(config={"use_dora": True}), "adapter_config.json: field 'use_dora': DoRA adapters are not supported"),
    "rank_str": (dict(config={"r": "4"}), "adapter_config.json: field 'r' must be an integer in [1, 65536], got '4'"),
    "shape": (dict(tensors={"layers.0.self_attn.q_proj.lora_B": torch.zeros(64, 3)}),
              "adapter_model.safetensors: 'model.layers.0.self_attn.q_proj.weight': lora_A [4, 64] and lora_B "
              "[64, 3] are not [r, in] and [out, r] with the config's r = 4"),
    "half": (dict(tensors={"layers.1.self_attn.v_proj.lora_A": None}),
             "adapter_model.safetensors: 'model.layers.1.self_attn.v_proj.weight' has lora_B but not lora_A"),
}


@pytest.mark.parametrize("kind", sorted(BAD_ADAPTERS))
def test_lora_load_checks_the_adapter_at_start_up(tiny_model_dir, tmp_path, kind):
    edits, says = BAD_ADAPTERS[kind]
    d = make_adapter(tiny_model_dir, tmp_path / kind, **edits)
    out = _refusal(tiny_model_dir, "--lora-load", str(d))
    assert "--lora-load: " in out and str(d) in out and says in out, out


def test_lora_load_shapes_against_the_model_and_values_in_the_trainer(tiny_model_dir, tmp_path):
    from slick.config.config import Config
    from slick.train.trainer import Trainer

    wide = make_adapter(tiny_model_dir, tmp_path / "wide", tensors={   # A and B agree with r, not with the model
        "layers.0.self_attn.q_proj.lora_A": torch.zeros(4, 65), "layers.0.self_attn.q_proj.lora_B": torch.zeros(65, 4)})
    out = _refusal(tiny_model_dir, "--lora-load", str(wide))
    assert ("'model.layers.0.self_attn.q_proj.weight': lora_B @ lora_A is [65, 65]; the model's weight is [64, 64]"
            in out), out
    nan = make_adapter(tiny_model_dir, tmp_path / "nanB", tensors={"layers.0.self_attn.v_proj.lora_B":
                                                                     torch.full((32, 4), float("nan"))})
    cfg = Config.from_flat(dict(hf_checkpoint=str(tiny_model_dir), dtype="fp32", device="cpu", lora_load=str(nan)))
    with pytest.raises(ValueError, match=r"adapter_model.safetensors: tensor 'base_model.model.model.layers.0."
                                         r"self_attn.v_proj.lora_B.weight' holds NaN or infinite values"):
        Trainer(cfg)


def test_engine_refuses_a_bad_adapter_directory_and_keeps_its_weights(tiny_model_dir, tmp_path):
    eng = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", threaded=False)
    try:
        before = {n: t.clone() for n, t in eng.model.targets.items()}
        for kind, (edits, says) in BAD_ADAPTERS.items():
            d = make_adapter(tiny_model_dir, tmp_path / kind, **edits)
            with pytest.raises(WeightUpdateError) as e:
                eng.update_weights_sync(path=str(d), version=7)
            assert says.split(": ", 1)[-1] in str(e.value), (kind, str(e.value))
        assert asyncio.run(eng.get_weight_version()) == 0
        assert all(torch.equal(before[n], eng.model.targets[n]) for n in before)
        assert eng.update_weights_sync(path=str(make_adapter(tiny_model_dir, tmp_path / "good")), version=3) == 3
    finally:
        eng.close_sync()


def _logprobs(url: str) -> list:
    async def go():
        eng = HttpEngine([url])
        try:
            gen = await eng.generate([1, 2, 3, 4], SamplingParams(max_new_tokens=4, temperature=0.0))
            return gen.token_ids, gen.logprobs, await eng.get_weight_version()
        finally:
            await eng.close()
    return asyncio.run(go())


def _update(url: str, path) -> str:
    async def go():
        eng = HttpEngine([url])
        try:
            return await eng.update_weights(path=str(path), version=9)
        finally:
            await eng.close()
    try:
        return f"ok {asyncio.run(go())}"
    except EngineError as e:
        return str(e)


def test_slick_serve_answers_400_to_a_non_finite_adapter_and_keeps_serving_the_old_weights(tiny_model_dir, tmp_path):
    nan = make_adapter(tiny_model_dir, tmp_path / "nan", config={"lora_alpha": float("nan")})
    huge = make_adapter(tiny_model_dir, tmp_path / "huge", config={"lora_alpha": 1e30})
    good = make_adapter(tiny_model_dir, tmp_path / "good")
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240,
                          extra_args=["--allowed-weight-dirs", str(tmp_path)])
    try:
        before = _logprobs(w.url)
        assert before[2] == 0 and all(math.isfinite(x) for x in before[1])
        for d, alpha in ((nan, "nan"), (huge, "1e+30")):
            out = _update(w.url, d)
            assert "HTTP 400" in out and f"field 'lora_alpha' must be a finite number in (0, 65536], got {alpha}" \
                in out and str(d) in out, out
            assert _logprobs(w.url) == before     # same tokens, same logprobs, version 0: the old weights
        assert _update(w.url, good) == "ok 9"
        after = _logprobs(w.url)
        assert after[2] == 9 and after[1] != before[1] and all(math.isfinite(x) for x in after[1])
    finally:
        w.stop()


# ---------------------------------------------------------------------------------------------- checkpoints
@pytest.fixture(scope="module")
def saved(tiny_model_dir, tmp_path_factory):
    """A real one-process checkpoint of the tiny model (step 1) and a trainer to load it into."""
    from slick.ckpt.checkpoint import save_checkpoint
    from slick.train.trainer import Trainer
    from tests.test_train import make_cfg

    tr = Trainer(make_cfg(tiny_model_dir))
    root = tmp_path_factory.mktemp("ck")
    return save_checkpoint(root, 1, tr, {"cursor": 0}), tr


def _copy(step_dir, tmp_path):
    import shutil

    return Path(shutil.copytree(step_dir, tmp_path / "step_000001"))


def _manifest(d, add=None, **replace):
    m = json.loads((d / "manifest.json").read_text())
    m["files"].update(add or {})
    m.update(replace)
    (d / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("edit, says", [
    (dict(files=None), "manifest.json: field 'files' is None, not an object of file -> size in bytes"),
    (dict(files=[1, 2]), "manifest.json: field 'files' is [1, 2], not an object of file -> size in bytes"),
    (dict(add={"model/config.json": "12"}), "manifest.json: field 'files' gives 'model/config.json' the size 12, "
                                             "not a number of bytes"),
    (dict(add={"../../etc/passwd": 10}), "manifest.json: field 'files' names '../../etc/passwd', a path outside"),
])
def test_load_refuses_a_manifest_with_wrong_types_naming_the_field(saved, tmp_path, edit, says):
    from slick.ckpt.checkpoint import load_checkpoint

    d = _copy(saved[0], tmp_path)
    _manifest(d, **edit)
    with pytest.raises(ValueError) as e:
        load_checkpoint(d, saved[1])
    assert f"--load {d}: checkpoint is incomplete or corrupt: {says}" in str(e.value), str(e.value)


def test_load_refuses_a_safetensors_header_claiming_a_huge_tensor(saved, tmp_path):
    from slick.ckpt.checkpoint import load_checkpoint

    d = _copy(saved[0], tmp_path)
    f = sorted((d / "model").glob("*.safetensors"))[0]
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [10 ** 7, 10 ** 7]
    new = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])
    _manifest(d, add={str(f.relative_to(d)): f.stat().st_size})   # a consistent manifest: the header is the lie
    with pytest.raises(ValueError) as e:
        load_checkpoint(d, saved[1])
    assert str(e.value).startswith(f"{f}: tensor {name!r}: field 'shape' [10000000, 10000000] of F32 needs "
                                   f"400000000000000 bytes; its data_offsets hold "), str(e.value)
