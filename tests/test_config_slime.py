"""slime's names and defaults (tests/slime_flags.py as data): defaults equal, spellings accepted, refusals named."""
import dataclasses

import pytest

from slick.config import ConfigError
from slick.configure import parse_config
from slick.config.groups import GROUPS
from tests import slime_flags as S

DEFAULTS = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
            for cls in GROUPS.values() for f in dataclasses.fields(cls)}


def field(flag: str) -> str:
    return flag[2:].replace("-", "_")


def empty():
    return parse_config([], validate=False)


@pytest.mark.parametrize("flag,slime_default", S.SAME, ids=[r[0] for r in S.SAME])
def test_shared_flag_has_slimes_default(flag, slime_default):
    want = [] if slime_default is None and isinstance(DEFAULTS[field(flag)], list) else slime_default
    got = getattr(empty(), field(flag))
    assert got == want and type(got) is type(want), f"{flag}: slick {got!r}, slime {slime_default!r}"


@pytest.mark.parametrize("flag,slime_default,means,why", S.SAME_MEANING, ids=[r[0] for r in S.SAME_MEANING])
def test_shared_flag_means_slimes_default(flag, slime_default, means, why):
    assert getattr(empty(), field(flag)) == means


@pytest.mark.parametrize("flag,argv,name,value", S.ALIASES, ids=[" ".join(r[1]) for r in S.ALIASES])
def test_slime_spelling_parses_to_slicks_field(flag, argv, name, value):
    cfg = parse_config(argv, validate=False)
    assert getattr(cfg, name) == value
    assert cfg.flat() == parse_config(_slick_argv(cfg), validate=False).flat()


def _slick_argv(cfg) -> list:
    """The same config in slick's own spelling: every field that differs from its default."""
    out = []
    for k, v in cfg.flat().items():
        if v == DEFAULTS[k]:
            continue
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else [flag, *map(str, v)] if isinstance(v, list) else [flag, str(v)]
    return out


@pytest.mark.parametrize("flag,slime_default,name,slick_default", S.SAME_VIA_ALIAS,
                         ids=[r[0] for r in S.SAME_VIA_ALIAS])
def test_aliased_flag_has_slimes_default(flag, slime_default, name, slick_default):
    assert getattr(empty(), name) == slick_default


@pytest.mark.parametrize("argv,words", S.REFUSED, ids=[" ".join(r[0]) for r in S.REFUSED])
def test_slime_flag_slick_cannot_honour_is_refused_by_name(argv, words):
    with pytest.raises(ConfigError) as e:
        parse_config(argv, validate=False)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("flag,slime_default,slick_default,why", S.DIFFERS, ids=[r[0] for r in S.DIFFERS])
def test_listed_difference_is_slicks_default(flag, slime_default, slick_default, why):
    name = S.DIFFERS_FIELD.get(flag, field(flag))
    assert DEFAULTS[name] == slick_default != slime_default


def test_every_flag_of_the_table_is_a_slick_or_slime_spelling():
    from slick.configure.parse import build_parser

    known = build_parser()._option_string_actions
    rows = [r[0] for r in S.SAME + S.SAME_MEANING + S.ALIASES + S.SAME_VIA_ALIAS + S.DIFFERS]
    assert [f for f in rows if f not in known] == []
    assert len({r[0] for r in S.DIFFERS}) == 19       # the differences slick keeps: a new one must be added here


def test_differences_and_spellings_are_in_the_flags_doc():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "flags.md").read_text(encoding="utf-8")
    section = doc.split("## slime users", 1)[1]
    for flag in {r[0] for r in S.ALIASES + S.DIFFERS} | {r[0][0] for r in S.REFUSED[:2]}:
        assert f"`{flag}`" in section, flag
    kept = section.split("Defaults slick keeps", 1)[1]
    assert sorted(line.split("`")[1] for line in kept.splitlines() if line.startswith("| `")) == \
        sorted(r[0] for r in S.DIFFERS)


def test_kl_loss_type_default_is_slimes_k1_and_low_var_kl_still_parses():
    assert empty().kl_loss_type == "k1"
    assert parse_config(["--kl-loss-type", "low_var_kl"], validate=False).kl_loss_type == "low_var_kl"


def test_eval_top_p_unset_follows_rollout_top_p():
    from slick.rollout.manager import sampling_from_config

    cfg = parse_config(["--rollout-top-p", "0.7"], validate=False)
    assert sampling_from_config(cfg, eval=True).top_p == 0.7
    cfg = parse_config(["--rollout-top-p", "0.7", "--eval-top-p", "0.9"], validate=False)
    assert sampling_from_config(cfg, eval=True).top_p == 0.9 and sampling_from_config(cfg).top_p == 0.7


def test_a_slime_script_leaving_out_a_meaning_default_is_warned_by_name(caplog):
    from slick.config.slime import CHANGES_MEANING, KEPT_DEFAULTS, slime_script_warnings

    # a slime script: Megatron's model-shape flags (slime's scripts/models/*.sh), --weight-decay given
    with caplog.at_level("WARNING", logger="slick.config"):
        parse_config(["--num-layers", "30", "--hidden-size", "576", "--weight-decay", "0.1"], validate=False)
    warned = [r.getMessage() for r in caplog.records if "reads as a slime script" in r.getMessage()]
    want = [f for f in CHANGES_MEANING if f != "--weight-decay"]
    assert [m.split(" ", 1)[0] for m in warned] == want
    assert warned[want.index("--n-samples-per-prompt")].startswith(
        "--n-samples-per-prompt is not given: slime's default is 1, slick's differs (")
    assert all("(--num-layers given)" in m for m in warned)
    # a slime spelling is a sign too; a slick command (no such flag) is not warned
    assert len(slime_script_warnings({"slime__log_probs_chunk_size": 64})) == len(CHANGES_MEANING)
    assert slime_script_warnings({"lr": 1e-6, "rollout_batch_size": 8, "weight_decay": 0.0}) == []
    assert all(f in KEPT_DEFAULTS for f in CHANGES_MEANING)
