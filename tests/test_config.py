"""Config: slime flag names, YAML loading, --sglang-* pass-through, validation, CLI help, flag docs."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slick.config import Config, ConfigError
from slick.configure import build_parser, parse_config
from slick.configure.validate import validate_config
from tests.hf_dirs import write_model_dir

ROOT = Path(__file__).resolve().parents[1]

# The slime-compatible flags listed in DESIGN.md ("accept these names with these meanings").
SLIME_FLAGS = """
--prompt-data --input-key --label-key --metadata-key --tool-key --apply-chat-template --rollout-shuffle
--rollout-seed --num-epoch --num-rollout --rollout-batch-size --n-samples-per-prompt --global-batch-size
--num-steps-per-rollout --micro-batch-size --rollout-max-prompt-len --rollout-max-response-len
--rollout-temperature --rollout-top-p --rollout-top-k --rollout-stop --over-sampling-batch-size
--partial-rollout
--advantage-estimator --use-kl-loss --kl-loss-coef --kl-loss-type --kl-coef --eps-clip --eps-clip-high
--eps-clip-c --entropy-coef --normalize-advantages --disable-grpo-std-normalization
--disable-rewards-normalization --calculate-per-token-loss --use-tis --tis-clip --tis-clip-low
--use-rollout-logprobs --gamma --lambd --lr --clip-grad --seed
--rm-type --rm-url --custom-rm-path --group-rm --reward-key
--hf-checkpoint --load --save --save-interval --save-hf
--eval-interval --eval-prompt-data --n-samples-per-eval-prompt --eval-temperature --eval-max-response-len
--colocate --actor-num-nodes --actor-num-gpus-per-node --rollout-num-gpus --rollout-num-gpus-per-engine
--use-fault-tolerance --update-weights-interval
--use-tensorboard --use-wandb --wandb-project --wandb-group
--save-debug-rollout-data --load-debug-rollout-data --debug-rollout-only --debug-train-only
--custom-generate-function-path --custom-rm-path --dynamic-sampling-filter-path --buffer-filter-path
--rollout-function-path --custom-loss-function-path --custom-advantage-function-path
""".split()


@pytest.fixture(scope="module")
def parser():
    return build_parser()


def _example(action):
    """(argv values, expected parsed value) for one argparse action, different from its default."""
    if action.nargs == 0:
        return [], True
    if action.choices:
        pick = list(action.choices)[-1]
        return [str(pick)], pick
    typ = action.type or str
    if action.nargs in ("+", "*"):
        vals = ["3", "5"] if typ is int else ["a", "b"]
        return vals, [typ(v) for v in vals]
    if typ is int:
        return ["7"], 7
    if typ is float:
        return ["0.25"], 0.25
    return ["some/value"], "some/value"


@pytest.mark.parametrize("flag", sorted(set(SLIME_FLAGS)))
def test_slime_flag_parses_with_its_dest(parser, flag):
    action = parser._option_string_actions.get(flag)
    assert action is not None, f"{flag} is not accepted"
    dest = flag[2:].replace("-", "_")
    assert action.dest == dest
    vals, want = _example(action)
    if flag == "--eval-prompt-data":
        vals, want = ["gsm", "data/gsm.jsonl"], ["gsm", "data/gsm.jsonl"]
    cfg = parse_config([flag, *vals], validate=False)
    assert getattr(cfg, dest) == want


def test_choices_are_enforced_on_the_command_line(parser, capsys):
    with pytest.raises(SystemExit):
        parser.parse_args(["--advantage-estimator", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


# -- YAML ---------------------------------------------------------------------------------------
def test_yaml_flat_and_grouped_with_flags_overriding(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("rollout-batch-size: 4\nlr: 1e-5\nuse_kl_loss: true\nrollout_stop: '</s>'\n")
    cfg = parse_config(["--config", str(flat), "--lr", "3e-6"], validate=False)
    assert cfg.rollout_batch_size == 4 and cfg.use_kl_loss is True
    assert cfg.lr == 3e-6                              # flag beats file
    assert cfg.rollout_stop == ["</s>"]                # a scalar becomes a one-item list
    cfg = parse_config(["--config", str(flat)], validate=False)
    assert cfg.lr == 1e-5 and isinstance(cfg.lr, float)  # YAML 1.1 reads 1e-5 as text; we convert it

    grouped = tmp_path / "grouped.yaml"
    grouped.write_text(yaml.safe_dump({"rollout": {"n_samples_per_prompt": 2, "sglang": {"tp": 1}},
                                       "algorithm": {"advantage-estimator": "gspo"},
                                       "seed": 9}))
    cfg = parse_config(["--config", str(grouped), "--n-samples-per-prompt", "3"], validate=False)
    assert cfg.n_samples_per_prompt == 3 and cfg.advantage_estimator == "gspo" and cfg.seed == 9
    assert cfg.rollout.sglang == {"tp": 1}


def test_yaml_errors_name_the_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout_batch_sise: 4\nlr: fast\nuse_kl_loss: 3\n")
    with pytest.raises(ConfigError) as e:
        parse_config(["--config", str(bad)], validate=False)
    msg = str(e.value)
    assert f"{bad}: unknown config key 'rollout_batch_sise'" in msg
    assert f"{bad}: key 'lr' expects float, got 'fast'" in msg
    assert f"{bad}: key 'use_kl_loss' expects bool, got 3" in msg
    with pytest.raises(ConfigError, match="file not found"):
        parse_config(["--config", str(tmp_path / "missing.yaml")], validate=False)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        parse_config(["--config", str(tmp_path / "list.yaml")], validate=False)


def test_resolved_config_round_trips_through_yaml(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x"}\n')
    model = write_model_dir(tmp_path / "model")
    cfg = parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
                        "--global-batch-size", "8", "--lr", "2e-6", "--sglang-tp", "2"])
    dumped = tmp_path / "config.yaml"
    dumped.write_text(yaml.safe_dump(cfg.to_dict()))
    again = parse_config(["--config", str(dumped)])
    assert again.to_dict() == cfg.to_dict()
    assert again.num_steps_per_rollout == 2


# -- --sglang-* ---------------------------------------------------------------------------------
def test_sglang_pass_through(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("sglang: {mem_fraction_static: 0.5, tp_size: 1}\n")
    cfg = parse_config(["--config", str(y), "--sglang-mem-fraction-static", "0.8", "--lr", "1e-6",
                        "--sglang-enable-metrics", "--sglang-log-level=warning"], validate=False)
    assert cfg.sglang == {"mem_fraction_static": "0.8", "tp_size": 1, "enable_metrics": True,
                          "log_level": "warning"}
    assert cfg.lr == 1e-6


# -- validation ---------------------------------------------------------------------------------
@pytest.fixture
def data_file(tmp_path):
    p = tmp_path / "train.jsonl"
    p.write_text('{"prompt": "x"}\n')
    return str(p)


@pytest.fixture
def model_dir(tmp_path):
    return str(write_model_dir(tmp_path / "model"))


@pytest.fixture
def make(model_dir):
    def make(data_file, **kw):
        return Config.from_flat({"prompt_data": data_file, "hf_checkpoint": model_dir, **kw})
    return make


def problems_of(cfg):
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    return e.value.problems


def test_valid_config_passes(data_file, make):
    cfg = validate_config(make(data_file, rollout_batch_size=4, n_samples_per_prompt=8))
    assert (cfg.global_batch_size, cfg.num_steps_per_rollout) == (32, 1)


def test_batch_constraint_mismatch_shows_numbers(data_file, make):
    (p,) = problems_of(make(data_file, rollout_batch_size=4, n_samples_per_prompt=8, global_batch_size=16,
                            num_steps_per_rollout=3))
    assert "4 x 8 = 32" in p and "16 x 3 = 48" in p


@pytest.mark.parametrize("given,want", [
    ({"global_batch_size": 8}, (8, 4)),
    ({"num_steps_per_rollout": 2}, (16, 2)),
    ({"global_batch_size": 32}, (32, 1)),
    ({"global_batch_size": 16, "num_steps_per_rollout": 2}, (16, 2)),
])
def test_batch_derivation(data_file, make, given, want):
    cfg = validate_config(make(data_file, rollout_batch_size=4, n_samples_per_prompt=8, **given))
    assert (cfg.global_batch_size, cfg.num_steps_per_rollout) == want


def test_batch_derivation_needs_a_divisor(data_file, make):
    (p,) = problems_of(make(data_file, rollout_batch_size=4, n_samples_per_prompt=8, global_batch_size=5))
    assert "--global-batch-size 5 does not divide" in p and "32" in p
    (p,) = problems_of(make(data_file, rollout_batch_size=3, n_samples_per_prompt=3, num_steps_per_rollout=2))
    assert "--num-steps-per-rollout 2 does not divide" in p and "= 9" in p


@pytest.mark.parametrize("kw,needle", [
    ({"kl_coef": 0.1, "kl_loss_coef": 0.01}, "--kl-coef and --kl-loss-coef are both non-zero"),
    ({"eps_clip_c": 1.0}, "--eps-clip-c must be > 1 (got 1.0)"),
    ({"eps_clip_c": 0.5}, "--eps-clip-c must be > 1 (got 0.5)"),
    ({"rollout_temperature": 0.0}, "--rollout-temperature must be > 0"),
    ({"rollout_temperature": -1.0}, "(got -1.0)"),
    ({"advantage_estimator": "ppo2"}, "unknown --advantage-estimator 'ppo2' (choose from grpo, gspo, ppo,"),
    ({"dtype": "fp16"}, "unknown --dtype 'fp16' (choose from auto, bf16, fp32)"),   # YAML skips argparse's choices
    ({"rm_type": "bogus"}, "unknown --rm-type 'bogus'"),
    ({"rm_type": "boxed_bogus"}, "unknown --rm-type 'boxed_bogus'"),
    ({"rm_type": "boxed_remote_rm"}, "unknown --rm-type 'boxed_remote_rm'"),
    ({"rm_type": "remote_rm"}, "--rm-type remote_rm needs --rm-url"),
    ({"rollout_batch_size": 0}, "--rollout-batch-size must be positive"),
])
def test_each_validation_error(data_file, make, kw, needle):
    problems = problems_of(make(data_file, **kw))
    assert len(problems) == 1 and needle in problems[0], problems


def test_known_rm_types_and_custom_rm_pass(data_file, make):
    for rm in ("math", "gsm8k", "boxed_math", "exact", "f1", "countdown"):
        validate_config(make(data_file, rm_type=rm))
    validate_config(make(data_file, rm_type="anything", custom_rm_path="pkg.mod.fn"))
    validate_config(make(data_file, rm_type="remote_rm", rm_url="http://127.0.0.1:1/rm"))


def test_prompt_data_file_checks(tmp_path, data_file, model_dir, make):
    (p,) = problems_of(make(str(tmp_path / "nope.jsonl") + "@[0:10]"))
    assert p == f"--prompt-data: file not found: {tmp_path / 'nope.jsonl'}"
    assert problems_of(Config()) == ["--prompt-data is required (or --load-debug-rollout-data)",
                                     "--hf-checkpoint is required (a local Hugging Face model directory)"]
    validate_config(make(data_file + "@[0:1]"))          # a slice on an existing file is fine
    validate_config(Config.from_flat({"load_debug_rollout_data": str(tmp_path), "hf_checkpoint": model_dir}))
    (p,) = problems_of(make(data_file, eval_prompt_data=["aime", str(tmp_path / "aime.jsonl")]))
    assert p == f"--eval-prompt-data: file not found: {tmp_path / 'aime.jsonl'}"


def test_several_problems_reported_together(tmp_path, model_dir):
    cfg = Config.from_flat({"prompt_data": str(tmp_path / "missing.jsonl"), "hf_checkpoint": model_dir,
                            "rollout_batch_size": 4,
                            "n_samples_per_prompt": 2, "global_batch_size": 3, "num_steps_per_rollout": 1,
                            "kl_coef": 0.1, "kl_loss_coef": 0.1, "eps_clip_c": 0.9, "rollout_temperature": 0.0})
    problems = problems_of(cfg)
    assert len(problems) == 5
    text = str(ConfigError(problems))
    for needle in ("batch sizes disagree", "--kl-coef and --kl-loss-coef", "--eps-clip-c",
                   "--rollout-temperature", "file not found"):
        assert needle in text
    assert text.count("\n  - ") == 5   # one per line


def test_parse_config_validates(tmp_path):
    with pytest.raises(ConfigError, match="--prompt-data is required"):
        parse_config(["--lr", "1e-6"])


# -- CLI and docs -------------------------------------------------------------------------------
def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "slick.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cli_help():
    r = run_cli("--help")
    assert r.returncode == 0, r.stderr
    assert "train" in r.stdout and "flags" in r.stdout
    assert run_cli("no-such-command").returncode == 2


def test_train_parser_help_lists_every_flag(parser):
    text = parser.format_help()
    for flag in set(SLIME_FLAGS) | {"--config", "--max-staleness"}:
        assert flag in text, flag


def test_flags_command_prints_the_reference():
    from slick.configure.docs import render_markdown

    r = run_cli("flags")
    assert r.returncode == 0, r.stderr
    assert r.stdout == render_markdown()


def test_committed_flag_docs_are_current():
    from slick.configure.docs import render_markdown

    committed = (ROOT / "docs" / "flags.md").read_text(encoding="utf-8")
    assert committed == render_markdown(), "docs/flags.md is stale: run `slick flags --write docs/flags.md`"


def test_flag_docs_cover_every_flag_with_type_and_default(parser):
    from slick.configure.docs import render_markdown

    text = render_markdown()
    flags = {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    for flag in flags - {"--config"}:
        assert f"| `{flag}` |" in text, flag
    assert "| `--lr` | float | `1e-06` |" in text
    assert "| `--advantage-estimator` | {grpo, gspo, ppo, reinforce_plus_plus, reinforce_plus_plus_baseline, rloo}" \
           " | `grpo` |" in text
    assert "| `--sglang-KEY VALUE` |" in text and "## Batch-size constraint" in text


def test_write_flag_docs(tmp_path):
    from slick.configure.docs import main, render_markdown

    out = tmp_path / "sub" / "flags.md"
    assert main(["--write", str(out)]) == 0
    assert out.read_text() == render_markdown()
