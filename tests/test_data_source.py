"""DataSource: grouping, indices, epochs, deterministic shuffling and exact resume."""
import json

import pytest

from slick.data import DataSource
from slick.data.source import epoch_order


def make_rows(n):
    return [{"prompt_index": i, "prompt": [{"role": "user", "content": f"q{i}"}], "label": str(i),
             "metadata": {"i": i}, "tools": None, "prompt_ids": [100 + i, 7]} for i in range(n)]


def flat(groups):
    return [(s.index, s.group_index, s.prompt_index) for g in groups for s in g]


def test_groups_and_indices():
    src = DataSource(make_rows(5), n_samples_per_prompt=3)
    g = src.get_groups(2)
    assert [len(x) for x in g] == [3, 3]
    assert flat(g) == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 1, 1), (4, 1, 1), (5, 1, 1)]
    s = g[1][2]
    assert s.prompt == [{"role": "user", "content": "q1"}] and s.label == "1"
    assert s.metadata == {"i": 1} and s.prompt_ids == [101, 7] and s.tools is None
    # samples do not share mutable state with each other or with the dataset
    g[1][0].metadata["x"] = 1
    g[1][0].prompt_ids.append(9)
    g[1][0].prompt[0]["content"] = "changed"
    assert g[1][1].metadata == {"i": 1} and g[1][1].prompt_ids == [101, 7]
    assert src.dataset[1]["prompt"][0]["content"] == "q1"
    assert src.consumed == 2 and src.epoch == 0


def test_epoch_wrap_without_shuffle():
    src = DataSource(make_rows(3), n_samples_per_prompt=1)
    order = [g[0].prompt_index for g in src.get_groups(7)]
    assert order == [0, 1, 2, 0, 1, 2, 0]
    assert src.epoch == 2 and src.consumed == 7
    assert [g[0].group_index for g in src.get_groups(2)] == [7, 8]


def test_shuffle_is_a_seeded_permutation_per_epoch():
    n = 20
    src = DataSource(make_rows(n), 1, shuffle=True, seed=3)
    e0 = [g[0].prompt_index for g in src.get_groups(n)]
    e1 = [g[0].prompt_index for g in src.get_groups(n)]
    assert sorted(e0) == sorted(e1) == list(range(n))   # each epoch covers every prompt once
    assert e0 != e1 and e0 != list(range(n))            # reshuffled per epoch
    assert e0 == epoch_order(n, 0, True, 3) and e1 == epoch_order(n, 1, True, 3)
    again = DataSource(make_rows(n), 1, shuffle=True, seed=3)
    assert [g[0].prompt_index for g in again.get_groups(n)] == e0
    other = DataSource(make_rows(n), 1, shuffle=True, seed=4)
    assert [g[0].prompt_index for g in other.get_groups(n)] != e0


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("k", [0, 3, 7, 11])
def test_resume_continues_exactly(shuffle, k):
    rows = make_rows(7)
    ref = DataSource(rows, 2, shuffle=shuffle, seed=11)
    ref.get_groups(k)                     # the uninterrupted run
    want = [[s.to_dict() for s in g] for g in ref.get_groups(9)]

    src = DataSource(rows, 2, shuffle=shuffle, seed=11)
    src.get_groups(k)
    state = json.loads(json.dumps(src.state_dict()))  # must survive JSON
    resumed = DataSource(rows, 2, shuffle=shuffle, seed=11)
    resumed.load_state_dict(state)
    assert resumed.epoch == src.epoch and resumed.consumed == k
    got = [[s.to_dict() for s in g] for g in resumed.get_groups(9)]
    assert got == want


def test_put_back_is_handed_out_first_and_survives_resume():
    src = DataSource(make_rows(4), 2)
    first = src.get_groups(2)
    first[1][0].response_ids = [5, 6]   # e.g. a partial response kept for continuation
    src.put_back([first[1]])
    state = json.loads(json.dumps(src.state_dict()))
    resumed = DataSource(make_rows(4), 2)
    resumed.load_state_dict(state)
    for s in (src, resumed):
        nxt = s.get_groups(2)
        assert [g[0].group_index for g in nxt] == [1, 2]
        assert nxt[0][0].response_ids == [5, 6]
        assert nxt[1][0].prompt_index == 2 and s.consumed == 3


def test_num_steps():
    src = DataSource(make_rows(10), 4)
    assert src.num_steps(rollout_batch_size=4, num_epoch=1) == 3   # ceil(10/4)
    assert src.num_steps(rollout_batch_size=5, num_epoch=2) == 4
    assert src.num_steps(rollout_batch_size=3, num_epoch=3) == 10
    with pytest.raises(ValueError):
        src.num_steps(0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="non-empty"):
        DataSource([], 2)
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        DataSource(make_rows(2), 0)


def test_from_config_with_prompt_dataset(tmp_path, smollm2_dir):
    from transformers import AutoTokenizer

    from slick.config import Config
    from slick.data import PromptDataset

    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"question {i}", "label": i}) + "\n" for i in range(6)))
    cfg = Config.from_flat({"prompt_data": str(p), "n_samples_per_prompt": 4, "rollout_shuffle": True,
                            "rollout_seed": 5})
    ds = PromptDataset.from_config(cfg, AutoTokenizer.from_pretrained(smollm2_dir))
    src = DataSource.from_config(ds, cfg)
    groups = src.get_groups(6)
    assert all(len(g) == 4 for g in groups)
    assert sorted(g[0].prompt_index for g in groups) == list(range(6))
    for g in groups:
        assert g[0].label == g[0].prompt_index and g[0].prompt == f"question {g[0].prompt_index}"
        assert g[0].prompt_ids == ds[g[0].prompt_index]["prompt_ids"]
