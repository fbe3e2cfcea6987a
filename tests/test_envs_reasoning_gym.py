"""reasoning-gym tasks as prompt data (``--prompt-data reasoning-gym:TASK``) and their own verifiers
(``--rm-type reasoning_gym``), with the real package: rows reproducible by index in any process, the verifier's
scores, start-up checks, and two training steps on a tiny random model."""
import asyncio
import json
import os
import subprocess
import sys

import pytest

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.data import DataError, load_prompt_rows
from slick.data.source import DataSource
from slick.reward import LabelError, builtin_score
from slick.reward import reasoning_gym as rg
from slick.reward.hub import RewardHub
from slick.types import Sample

pytest.importorskip("reasoning_gym")

# isomorphic_strings iterates over sets: reasoning-gym's own items change with PYTHONHASHSEED
SPEC = "reasoning-gym:basic_arithmetic,isomorphic_strings?size=6&seed=3&system=direct"
ROWS_CODE = ("import json, sys; from slick.data import load_prompt_rows; "
             "print(json.dumps(load_prompt_rows(sys.argv[1])))")


def test_rows_interleave_tasks_and_name_their_items():
    rows = load_prompt_rows(SPEC)
    assert len(rows) == 12 and [r["prompt_index"] for r in rows] == list(range(12))
    tasks = [r["metadata"]["reasoning_gym"]["task"] for r in rows]
    assert tasks == ["basic_arithmetic", "isomorphic_strings"] * 6
    assert [r["metadata"]["reasoning_gym"]["index"] for r in rows] == [i // 2 for i in range(12)]
    first = rows[0]
    assert first["prompt"][0] == {"role": "system", "content": rg.system_prompts()["direct"]}
    assert first["prompt"][1]["role"] == "user" and first["prompt"][1]["content"].startswith("Calculate")
    assert first["label"] == str(rg.items("basic_arithmetic", 3, 6)[0]["answer"])
    assert load_prompt_rows(SPEC + "@[2:5]") == rows[2:5]
    bare = load_prompt_rows("reasoning-gym:basic_arithmetic?size=6&seed=3&system=none")   # the same items
    assert bare[0]["prompt"] == rows[0]["prompt"][1]["content"]
    other = load_prompt_rows("reasoning-gym:basic_arithmetic?size=6&seed=4&system=direct")
    assert [r["prompt"] for r in other] != [r["prompt"] for r in rows[::2]]      # another seed, other items


def test_rows_are_the_same_in_another_process_and_after_resume():
    """Another process (another hash seed) gets the very rows; a DataSource resumed over regenerated rows hands out
    exactly the prompts the uninterrupted one would."""
    rows = load_prompt_rows(SPEC)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", ROWS_CODE, SPEC], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    assert json.loads(out.stdout) == json.loads(json.dumps(rows))

    def tokenized(rows):   # a DataSource wants prompt_ids (PromptDataset's); any will do here
        return [dict(r, prompt_ids=[r["prompt_index"]]) for r in rows]

    full = DataSource(tokenized(rows), 2, shuffle=True, seed=9)
    first, rest = full.get_groups(3), full.get_groups(4)
    src = DataSource(tokenized(rows), 2, shuffle=True, seed=9)
    src.get_groups(3)
    state = json.loads(json.dumps(src.state_dict()))
    rg._ITEMS.clear()                       # regenerate, as a restarted driver does
    resumed = DataSource(tokenized(load_prompt_rows(SPEC)), 2, shuffle=True, seed=9)
    resumed.load_state_dict(state)
    got = resumed.get_groups(4)
    assert [(g[0].prompt, g[0].label, g[0].group_index) for g in got] == \
        [(g[0].prompt, g[0].label, g[0].group_index) for g in rest]
    assert {g[0].prompt_index for g in first}.isdisjoint({g[0].prompt_index for g in got})


def test_verifier_scores_right_and_wrong_answers():
    rows = load_prompt_rows(SPEC)
    for row in rows[:4]:
        meta, label = row["metadata"], row["label"]
        entry = rg.items(meta["reasoning_gym"]["task"], 3, 6)[meta["reasoning_gym"]["index"]]
        want = rg.dataset(meta["reasoning_gym"]["task"], 3, 6).score_answer(label, entry)
        assert want == 1.0
        assert builtin_score("reasoning_gym", f"thinking... <answer> {label} </answer>", label, meta) == 1.0
        assert builtin_score("reasoning_gym", "<answer>certainly not this</answer>", label, meta) == 0.0
        assert builtin_score("reasoning_gym", label, label, meta) == 0.0          # no <answer> tags: None
    j = rg.judge(f"<answer>1</answer> then <answer>{rows[0]['label']}</answer>", rows[0]["label"], rows[0]["metadata"])
    assert (j.score, j.answer, j.verdict, j.extras["task"]) == (1.0, rows[0]["label"], True, "basic_arithmetic")


def test_hub_scores_and_refuses_bad_labels():
    row = load_prompt_rows("reasoning-gym:basic_arithmetic?size=2&seed=3")[0]
    cfg = Config.from_flat(dict(rm_type="reasoning_gym"))
    good = Sample(prompt="q", label=row["label"], metadata=row["metadata"], response=f"<answer>{row['label']}</answer>")
    wrong_label = Sample(prompt="q", label="not the answer", metadata=row["metadata"], response="<answer>1</answer>")
    no_meta = Sample(prompt="q", label=row["label"], metadata={}, response="<answer>1</answer>")
    hub = RewardHub(cfg)

    async def go():
        await hub.score_group([good, wrong_label, no_meta])
        await hub.close()
    asyncio.run(go())
    assert good.reward == 1.0 and good.evidence["reward_type"] == "reasoning_gym"
    assert wrong_label.reward == 0.0 and "is not the answer of basic_arithmetic item 0" in \
        wrong_label.metadata["reward_error"]
    assert "metadata.reasoning_gym must name the item" in no_meta.metadata["reward_error"]
    assert hub.stats()["reward/bad_labels"] == 2
    with pytest.raises(LabelError):
        rg.judge("<answer>1</answer>", "1", {"reasoning_gym": {"task": "basic_arithmetic", "seed": 0, "size": 2,
                                                               "index": 5}})


@pytest.mark.parametrize("spec, msg", [
    ("reasoning-gym:", "no task"), ("reasoning-gym:no_such_task", "unknown reasoning-gym task(s) no_such_task"),
    ("reasoning-gym:basic_arithmetic?size=0", "size must be >= 1"), ("reasoning-gym:basic_arithmetic?seed=x",
                                                                     "seed must be an integer"),
    ("reasoning-gym:basic_arithmetic?system=loud", "unknown system=loud"),
    ("reasoning-gym:basic_arithmetic,basic_arithmetic", "listed twice"),
    ("reasoning-gym:basic_arithmetic?size=2&no_such_field=1", "no_such_field"),
])
def test_bad_specs_are_data_errors(spec, msg):
    with pytest.raises(DataError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        load_prompt_rows(spec)


@pytest.mark.parametrize("kw, msg", [
    (dict(prompt_data="reasoning-gym:basic_arithmetic"), "pass --apply-chat-template"),
    (dict(prompt_data="reasoning-gym:nope", apply_chat_template=True), "unknown reasoning-gym task"),
    (dict(prompt_data="reasoning-gym:basic_arithmetic", apply_chat_template=True,
          eval_prompt_data=["heldout", "reasoning-gym:basic_arithmetic?size=20"]), "give the held-out set another seed"),
])
def test_start_up_checks(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        validate_config(Config.from_flat(dict(rm_type="reasoning_gym", hf_checkpoint=None, **kw)), check_files=True)


@pytest.mark.parametrize("extra", ["", '&operators=["%2B"]&min_terms=2&max_terms=2'])   # list-valued options too
def test_start_up_accepts_generated_data_without_a_file(extra):
    cfg = Config.from_flat(dict(rm_type="reasoning_gym", prompt_data=f"reasoning-gym:basic_arithmetic?seed=1{extra}",
                                apply_chat_template=True, eval_prompt_data=[
                                    "heldout", f"reasoning-gym:basic_arithmetic?seed=2&size=8{extra}"]))
    from slick.configure.validate import validate
    problems = []
    try:
        validate(cfg, check_files=True)
    except ConfigError as e:
        problems = [p for p in e.problems if "reasoning-gym" in p or "file not found" in p]
    assert problems == []


def test_two_training_steps(tiny_model_dir, tmp_path):
    from slick.loop.sync import train

    cfg = validate_config(Config.from_flat(dict(
        hf_checkpoint=str(tiny_model_dir), prompt_data="reasoning-gym:basic_arithmetic,leg_counting?size=4&seed=1",
        apply_chat_template=True, rm_type="reasoning_gym", rollout_batch_size=2, n_samples_per_prompt=2,
        rollout_max_response_len=8, lr=1e-3, num_rollout=2, dtype="fp32", run_dir=str(tmp_path / "run"),
        no_progress=True, seed=3, rollout_seed=5, micro_batch_size=4)))
    asyncio.run(train(cfg))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["reward/failures"] == 0 and r["reward/samples"] > 0 for r in steps)


@pytest.mark.slow
def test_readme_command_runs_one_step(tiny_model_dir, tmp_path):
    from tests.envs_readme import run_readme

    rows = run_readme("reasoning_gym", tiny_model_dir, tmp_path, {"size=500": "size=4", "size=20": "size=2",
                                                                  "--rollout-max-response-len 256":
                                                                  "--rollout-max-response-len 16"})
    step = [r for r in rows if "train/loss" in r]
    assert len(step) == 1 and step[0]["reward/failures"] == 0
    assert [r["step"] for r in rows if "eval/heldout" in r] == [0, 1]
