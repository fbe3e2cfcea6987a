"""`slick slime-check SCRIPT` on launch scripts with the flag sets of slime's examples (tests/slime_launch_scripts.py),
and the table of slime's other flags (slick/config/slime_table.py): each accepted with a meaning or refused by name,
never argparse's usage dump."""
import logging

import pytest

from slick import cli
from slick.config import ConfigError
from slick.config import slime_table
from slick.configure import parse_config
from slick.configure.parse import build_parser
from slick.configure.slime_check import check, read_script, split_flags, verdict
from tests.slime_flags import ARGUMENTS_PY
from tests.slime_launch_scripts import SCRIPTS

PATHS = {"{MODEL}": "/models/tiny", "{DATA}": "/data/train.jsonl", "{CHATS}": "/data/chats.jsonl",
         "{SAVE}": "/ckpt/run", "{PLUGIN}": "tests.slime_plugins", "{MODEL_ARGS}": "/models/args.sh"}


def script(name):
    text = SCRIPTS[name]
    for k, v in PATHS.items():
        text = text.replace(k, v)
    return text


def test_every_flag_of_slimes_arguments_is_known():
    known = build_parser()._option_string_actions
    assert len(ARGUMENTS_PY) == 223 and [f for f in ARGUMENTS_PY if f not in known] == []


@pytest.mark.parametrize("flag", sorted(slime_table.REFUSED))
def test_refused_flags_are_refused_one_by_one_with_their_reason(flag):
    with pytest.raises(ConfigError) as e:
        parse_config([flag, "1", "--lr", "1e-6"], validate=False)
    assert e.value.problems == [f"{flag}: not supported by slick ({slime_table.REFUSED[flag]})"]


def test_no_op_and_accepted_flags_say_why(caplog):
    caplog.set_level(logging.INFO, logger="slick.config")
    argv = [a for f in list(slime_table.NO_OP) + list(slime_table.ALWAYS) for a in (f, "x")]
    cfg = parse_config(argv, validate=False)
    assert cfg.lr == 1e-6
    for flag, why in slime_table.NO_OP.items():
        assert f"{flag} has no effect in slick: {why}" in caplog.text
    for flag, why in slime_table.ALWAYS.items():
        assert f"{flag}: accepted ({why})" in caplog.text


def test_a_script_is_read_as_bash_would_expand_it():
    entry, argv = read_script(script("grpo"))
    assert entry == "train.py"
    assert argv[:7] == ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--colocate",
                        "--hf-checkpoint", "/models/tiny"]
    assert argv[-10:] == ["--sglang-mem-fraction-static", "0.7", "--attention-dropout", "0.0", "--hidden-dropout",
                          "0.0", "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32",
                          "--attention-backend", "flash"]
    assert len(split_flags(argv)) == 55
    entry, argv = read_script(script("async"))       # a comment with parentheses inside an array
    flags = dict((f, v) for f, v in split_flags(argv))
    assert entry == "train_async.py" and flags["--actor-num-gpus-per-node"] == ["1"]
    assert flags["--rollout-num-gpus"] == ["${ROLLOUT_GPUS}"] and flags["--input-key"] == ["prompt"]
    entry, argv = read_script(script("multi-turn"))   # an empty variable is no word
    assert dict(split_flags(argv))["--wandb-key"] == []


@pytest.mark.parametrize("flag,kind", [
    ("--lr", "same"), ("--log-probs-chunk-size", "mapped"), ("--bf16", "mapped"), ("--attention-backend", "no-op"),
    ("--moe-grouped-gemm", "no-op"), ("--balance-data", "accepted"), ("--skip-eval-before-train", "accepted"),
    ("--offload", "refused"), ("--wandb-key", "refused"), ("--sglang-mem-fraction-static", "engine"),
    ("--frobnicate", "refused"),
])
def test_verdict_of_one_flag(flag, kind):
    known = set(build_parser()._option_string_actions)
    assert verdict(flag, known)[0] == kind
    assert verdict("--frobnicate", known) == ("refused", "unknown to slick")


@pytest.mark.parametrize("name,head,code", [
    ("grpo", "train.py -> slick train: 55 flags, 0 refused", 0),
    ("sft", "train_async.py -> slick train (SFT generates nothing to overlap): 31 flags, 0 refused", 1),
    ("multi-turn", "train.py -> slick train: 36 flags, 1 refused", 1),
    ("async", "train_async.py -> slick train-async: 37 flags, 0 refused", 0),
])
def test_report_of_each_script(name, head, code):
    lines, rc = check(script(name))
    assert lines[0] == head and rc == code
    body = "\n".join(lines)
    if name == "grpo":
        assert "mapped    --max-tokens-per-gpu 9216: " in body and "\n  ok" in body
        assert "no-op     --attention-backend flash: slick picks its attention kernels itself" in body
    if name == "sft":   # --num-epoch: the schedule's length needs the data set's size, which slick reads later
        assert "--lr-warmup-fraction 0.1 is a fraction of the decay steps" in body
    if name == "multi-turn":
        assert "refused   --wandb-key: set WANDB_API_KEY in the environment" in body
    if name == "async":
        assert "mapped    --rollout-function-path slime.rollout.fully_async_rollout" in body
        assert "--rollout-num-gpus ${ROLLOUT_GPUS}: slick's flag of the same name; its value is set outside" in body


def test_cli(tmp_path, capsys):
    path = tmp_path / "run.sh"
    path.write_text(script("grpo"))
    assert cli.main(["slime-check", str(path)]) == 0
    assert capsys.readouterr().out.startswith("train.py -> slick train: 55 flags, 0 refused\nsame      --actor-num")
    path.write_text("echo nothing to train\n")
    assert cli.main(["slime-check", str(path)]) == 2
    assert "no `python3 train.py ...`" in capsys.readouterr().err


def test_model_shape_flags_are_checked_against_config_json(tiny_model_dir, caplog):
    """The tiny model is a dense Llama: full rotary embeddings (config.json has no partial_rotary_factor: 1.0) and
    no experts."""
    caplog.set_level(logging.INFO, logger="slick.config")
    base = ["--hf-checkpoint", str(tiny_model_dir)]
    parse_config(base + ["--rotary-percent", "1.0", "--moe-aux-loss-coeff", "0"], validate=False)
    assert "--rotary-percent 1.0: matches config.json" in caplog.text and "--moe-aux-loss-coeff 0: accepted" in caplog.text
    with pytest.raises(ConfigError) as e:
        parse_config(base + ["--rotary-percent", "0.5", "--num-experts", "8", "--moe-aux-loss-coeff", "0.01"],
                     validate=False)
    assert sorted(e.value.problems) == sorted([
        "--rotary-percent 0.5 does not match the checkpoint's config.json (partial_rotary_factor: 1.0); slick "
        "builds the model from config.json: drop it",
        "--num-experts 8 does not match the checkpoint's config.json (num_experts / num_local_experts / "
        "n_routed_experts: None); slick builds the model from config.json: drop it",
        "--moe-aux-loss-coeff 0.01: not supported by slick (slick trains MoE models without an auxiliary "
        "load-balancing loss; only 0 is accepted)"])
    with pytest.raises(ConfigError, match="--num-experts: a Megatron model-shape flag, checked against"):
        parse_config(["--num-experts", "8"], validate=False)
    known = set(build_parser()._option_string_actions)
    assert verdict("--num-experts", known, ["8"])[0] == "checked"
    assert verdict("--moe-aux-loss-coeff", known, ["0"])[0] == "accepted"
    assert verdict("--moe-aux-loss-coeff", known, ["0.01"])[0] == "refused"


def test_sourced_model_args_are_read(tmp_path, capsys):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.sh").write_text("MODEL_ARGS=(\n  --num-layers 2 --swiglu\n)\n")
    script = tmp_path / "run.sh"
    script.write_text('SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"\n'
                      'source "${SCRIPT_DIR}/models/tiny.sh"\npython3 train.py ${MODEL_ARGS[@]} --lr 1e-6\n')
    assert read_script(script.read_text(), tmp_path) == ("train.py", ["--num-layers", "2", "--swiglu", "--lr", "1e-6"])
    assert read_script(script.read_text())[1] == ["--lr", "1e-6"]          # no directory: the file is not found
    assert cli.main(["slime-check", str(script)]) == 0
    assert "train.py -> slick train: 3 flags, 0 refused" in capsys.readouterr().out
