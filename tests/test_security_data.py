"""Issue 30, finding 8 (data and logs): append-only logs that a crash or a full disk cannot corrupt for the resumed
run, readers that name a bad line or file, and start-up checks of the data (lone surrogates, prompts that do not fit
the context) and of the configuration (every advantage 0)."""
import json
import logging
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from slick.config import Config, ConfigError
from slick.configure import build_parser, parse_config
from slick.configure.validate import validate_config
from slick.data import DataError, PromptDataset, load_prompt_rows
from slick.data.checks import check_run_prompts, check_zero_advantages
from slick.observe.appendlog import AppendLogError
from slick.observe.metrics import MetricsLogger, read_metrics
from tests.rollout_data import make_run

ROOT = Path(__file__).resolve().parents[1]
LINES = '{"step": 1, "time": 0, "x": 1.0}\n{"step": 2, "time": 0, "x": 2.0}\n'
HALF = '{"step": 3, "ti'                                  # what a crash mid-write leaves: 15 bytes, no newline


def read_strict(path):
    """read_metrics with every warning an error: the file must parse fully, last line included."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return read_metrics(path)


# ------------------------------------------------------------------ metrics.jsonl: the writer
def test_resumed_writer_cuts_a_half_written_line_and_says_how_many_bytes(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text(LINES + HALF)
    with caplog.at_level(logging.WARNING, logger="slick"):
        log = MetricsLogger(tmp_path)
    assert f"{path}: cut a partial last line of 15 bytes" in caplog.text
    assert path.read_text() == LINES
    with log:
        log.log({"x": 3.0}, step=3)
    rows = read_strict(tmp_path)
    assert [(r["step"], r["x"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert path.read_text().count("\n") == 3


def test_a_file_that_is_only_a_partial_line_is_emptied_and_a_whole_one_is_untouched(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text("x" * 70_000)                           # longer than the 64 KiB the cut reads at a time
    with caplog.at_level(logging.WARNING, logger="slick"):
        MetricsLogger(tmp_path).close()
    assert path.read_bytes() == b"" and "of 70000 bytes" in caplog.text
    path.write_text(LINES)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slick"):
        MetricsLogger(tmp_path).close()
    assert path.read_text() == LINES and "cut a partial" not in caplog.text


FSIZE_CHILD = textwrap.dedent('''
    import resource, signal, sys
    from slick.observe.appendlog import AppendLogError
    from slick.observe.metrics import MetricsLogger
    run_dir, limit = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # the write fails with EFBIG instead of killing us
    log = MetricsLogger(run_dir)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        log.log({"x": 3.0, "pad": 1.0}, step=3)
    except AppendLogError as e:
        print("ERROR", e)
        sys.exit(3)
''')


def test_a_write_cut_short_mid_line_is_rolled_back_and_the_resumed_run_appends_cleanly(tmp_path):
    """RLIMIT_FSIZE 10 bytes past the end: the kernel writes 10 bytes of the line, then refuses (EFBIG), as a
    full disk does. Before the fix those 10 bytes stayed, and the resumed run's first line was glued to them."""
    path = tmp_path / "metrics.jsonl"
    path.write_text(LINES)
    limit = len(LINES) + 10
    out = subprocess.run([sys.executable, "-c", FSIZE_CHILD, str(tmp_path), str(limit)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 3, out.stderr[-2000:]
    assert f"{path}: could not append a" in out.stdout and "cut back to its last complete line" in out.stdout
    assert path.read_text() == LINES                      # not LINES + 10 bytes of step 3
    with MetricsLogger(tmp_path) as log:                  # the resumed run
        log.log({"x": 3.0}, step=3)
    assert [r["step"] for r in read_strict(tmp_path)] == [1, 2, 3]


@pytest.fixture()
def small_tmpfs(tmp_path):
    """A real 64 KiB file system (tmpfs); needs root (skipped otherwise). Unmounted after the test."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_disk_full_leaves_only_whole_lines_and_the_resumed_run_appends_after_them(small_tmpfs):
    run_dir = small_tmpfs / "run"
    filler = small_tmpfs / "filler"
    filler.write_bytes(b"f" * 16384)                      # freed later, as an operator frees space
    metrics = {f"rollout/metric_{i:03d}": i / 7 for i in range(40)}    # ~1.4 KB a line: lines cross pages
    written = 0
    log = MetricsLogger(run_dir)
    with pytest.raises(AppendLogError, match=r"metrics\.jsonl: could not append a \d+-byte line \(No space left"):
        for step in range(1, 1000):
            log.log(metrics, step=step)
            written = step
    log.close()
    assert 10 < written < 60
    text = (run_dir / "metrics.jsonl").read_text()
    assert text.endswith("\n") and text.count("\n") == written
    filler.unlink()
    with MetricsLogger(run_dir) as log:                   # the resumed run
        log.log({"x": 1.0}, step=written + 1)
    rows = read_strict(run_dir)
    assert [r["step"] for r in rows] == list(range(1, written + 2))
    assert rows[-1]["x"] == 1.0 and rows[0]["rollout/metric_007"] == 1.0


# ------------------------------------------------------------------ readers name the bad line / file
GLUED = '{"step": 1, "rollout/raw_reward": 0.5}\n{"step": 2, "ti{"step": 3, "rollout/raw_reward": 0.7}\n'


def test_slick_plot_on_a_glued_line_names_file_and_line(tmp_path, capsys):
    from slick.cli import main as slick

    (tmp_path / "metrics.jsonl").write_text(GLUED)       # what a resumed run wrote before the fix
    assert slick(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"slick plot: {tmp_path / 'metrics.jsonl'}:2: corrupt metrics line" in err
    assert "remove or repair line 2" in err and "Traceback" not in err


def test_inspector_api_names_the_bad_metrics_line(tmp_path):
    from tests.test_inspect import get, inspector

    make_run(tmp_path, steps=(1,))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "ti{"step": 3}\n')
    with inspector(tmp_path) as url:
        err = get(url + "/api/metrics", 400)["error"]
        assert f"{tmp_path / 'metrics.jsonl'}:2: corrupt metrics line" in err
        assert get(url + "/api/run")["stored_steps"] == [1]


def test_rollouts_cli_skips_an_unreadable_step_file_naming_it(tmp_path, capsys, caplog):
    from slick.cli import main as slick

    make_run(tmp_path, steps=(1, 2, 3))
    bad = tmp_path / "rollouts" / "step_00000002.parquet"
    bad.write_bytes(bad.read_bytes()[:200])               # a copy cut short
    with caplog.at_level(logging.WARNING, logger="slick"):
        assert slick(["rollouts", str(tmp_path), "--json", "--limit", "0"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted({r["step"] for r in rows}) == [1, 3] and len(rows) == 16
    assert f"skipping unreadable step file {bad}" in caplog.text


# ------------------------------------------------------------------ lone surrogates in the data
def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("row, field", [
    ('{"prompt": "hi \\ud800 there"}', "field prompt holds a lone surrogate '\\ud800' at character 3"),
    ('{"prompt": [{"role": "user", "content": "ok \\udfff"}]}',
     "field prompt[0]['content'] holds a lone surrogate '\\udfff' at character 3"),
    ('{"prompt": "fine", "label": "\\ud83d"}', "field label holds a lone surrogate '\\ud83d' at character 0"),
    ('{"prompt": "fine", "metadata": {"a": ["x", "y\\udc00"]}}',
     "field metadata['a'][1] holds a lone surrogate '\\udc00' at character 1"),
])
def test_a_lone_surrogate_is_refused_at_load_naming_file_line_and_field(tmp_path, row, field):
    p = write_lines(tmp_path / "s.jsonl", ['{"prompt": "ok \\ud83d\\ude00"}', row])   # a valid pair, then the row
    with pytest.raises(DataError) as e:
        load_prompt_rows(str(p))
    assert str(e.value).startswith(f"{p}:2: {field}")


def test_a_lone_surrogate_in_parquet_json_text_names_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path / "s.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "metadata": ['{"k": 1}', '{"note": "x\\ud800"}']}), p)
    with pytest.raises(DataError, match=r"s\.parquet row 2: field metadata\['note'\] holds a lone surrogate"):
        load_prompt_rows(str(p))


def test_prompt_dataset_refuses_a_surrogate_instead_of_a_tokenizer_type_error(tmp_path, tiny_model_dir):
    from slick.models.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    p = write_lines(tmp_path / "s.jsonl", ['{"prompt": "ok \\ud83d\\ude00"}', "", '{"prompt": "\\ud800"}'])
    with pytest.raises(DataError, match=r"s\.jsonl:3: field prompt holds a lone surrogate"):
        PromptDataset(str(p), tok)
    ds = PromptDataset(f"{p}@[:1]", tok)                 # the valid pair is one character and tokenizes
    assert ds[0]["prompt"] == "ok \U0001F600" and ds.where == [f"{p}:1"]


# ------------------------------------------------------------------ prompts that do not fit the context
@pytest.fixture(scope="module")
def short_context_model(tmp_path_factory):
    """The tiny model with a 64-token context (max_position_embeddings)."""
    from slick.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("ctx64"), max_position_embeddings=64)


def long_prompts(tmp_path, n_words=70):
    rows = ['{"prompt": "question 0", "label": "0"}', "", '{"prompt": "' + "word " * n_words + '", "label": "1"}',
            '{"prompt": "question 2", "label": "2"}']
    return write_lines(tmp_path / "p.jsonl", rows)


def cfg_for(model, prompts, run_dir, **over):
    values = dict(hf_checkpoint=str(model), prompt_data=str(prompts), rollout_batch_size=2, n_samples_per_prompt=2,
                  rollout_max_response_len=8, rm_type="math", dtype="fp32", run_dir=str(run_dir),
                  no_progress=True, num_rollout=1)
    values.update(over)
    return validate_config(Config.from_flat(values))


def n_tokens(model, text):
    from slick.models.tokenizer import load_tokenizer

    return len(load_tokenizer(model)(text, add_special_tokens=False)["input_ids"])


def test_an_over_long_prompt_stops_the_run_at_start_naming_line_and_lengths(short_context_model, tmp_path):
    from slick.loop.run import Run

    n = n_tokens(short_context_model, "word " * 70)
    assert n > 56
    cfg = cfg_for(short_context_model, long_prompts(tmp_path), tmp_path / "run")
    with pytest.raises(DataError) as e:
        Run(cfg)
    assert str(e.value) == (
        f"1 of 3 prompts do not fit the context: prompt + --rollout-max-response-len 8 > 64 tokens "
        f"(max_position_embeddings in {short_context_model}/config.json): {tmp_path / 'p.jsonl'}:3: {n} prompt "
        f"tokens. Prompts are counted after the chat template; pass --rollout-max-prompt-len 56 to drop them, or "
        f"lower --rollout-max-response-len")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()     # no step ran, no logger was opened


def test_the_check_counts_chat_template_tokens_and_eval_budgets(short_context_model, tmp_path):
    from slick.models.tokenizer import load_tokenizer

    tok = load_tokenizer(short_context_model)
    words = "word " * 20
    raw = n_tokens(short_context_model, words)
    text = tok.apply_chat_template([{"role": "user", "content": words}], add_generation_prompt=True, tokenize=False)
    templated = n_tokens(short_context_model, text)
    assert templated > raw
    budget = 64 - raw                                   # fits as raw text, not once the template wraps it
    p = write_lines(tmp_path / "p.jsonl", ['{"prompt": "' + words + '"}'])
    plain = cfg_for(short_context_model, p, tmp_path / "r", rollout_max_response_len=budget)
    check_run_prompts(plain, PromptDataset.from_config(plain, tok), {})
    chat = cfg_for(short_context_model, p, tmp_path / "r", rollout_max_response_len=budget, apply_chat_template=True)
    with pytest.raises(DataError, match=rf"p\.jsonl:1: {templated} prompt tokens"):
        check_run_prompts(chat, PromptDataset.from_config(chat, tok), {})
    # eval sets: their own budget, and --sglang-context-length lowers the context of the engines slick starts
    ev = cfg_for(short_context_model, p, tmp_path / "r", eval_max_response_len=60, eval_prompt_data=["e", str(p)])
    train = PromptDataset.from_config(ev, tok)
    with pytest.raises(DataError, match=r"prompt \+ --eval-max-response-len 60 > 64 tokens"):
        check_run_prompts(ev, train, {"e": PromptDataset.from_config(ev, tok, spec=str(p))})
    short = cfg_for(short_context_model, p, tmp_path / "r", sglang={"context_length": "20"})
    with pytest.raises(DataError, match=r"8 > 20 tokens \(--sglang-context-length\): .*p\.jsonl:1: 21 prompt tokens"):
        check_run_prompts(short, PromptDataset.from_config(short, tok), {})


# ------------------------------------------------------------------ every advantage 0
def test_grpo_with_groups_of_one_is_refused_by_slick_train(tiny_model_dir, tmp_path):
    p = write_lines(tmp_path / "p.jsonl", ['{"prompt": "q", "label": "1"}'])
    out = subprocess.run([sys.executable, "-m", "slick.cli", "train", "--hf-checkpoint", str(tiny_model_dir),
                          "--prompt-data", str(p), "--rollout-batch-size", "1", "--n-samples-per-prompt", "1",
                          "--rm-type", "math", "--run-dir", str(tmp_path / "run"), "--no-progress"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 2, out.stderr[-3000:]
    assert ("--advantage-estimator grpo with --n-samples-per-prompt 1: every advantage will be 0" in out.stderr
            and "--allow-zero-advantages runs it anyway" in out.stderr and "Traceback" not in out.stderr)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("estimator, over, refused", [
    ("grpo", {}, True), ("gspo", {}, True), ("rloo", {}, True), ("reinforce_plus_plus_baseline", {}, True),
    ("ppo", {}, False), ("reinforce_plus_plus", {}, False),
    ("grpo", {"disable_rewards_normalization": True}, False),     # the raw reward is the advantage
    ("reinforce_plus_plus_baseline", {"kl_coef": 0.1}, False),   # the KL reward per token is not 0
    ("grpo", {"n_samples_per_prompt": 2}, False), ("rloo", {"debug_rollout_only": True}, False),
])
def test_which_configurations_are_refused(estimator, over, refused):
    cfg = Config.from_flat({"advantage_estimator": estimator, "n_samples_per_prompt": 1, **over})
    if refused:
        with pytest.raises(ConfigError, match=rf"--advantage-estimator {estimator} with --n-samples-per-prompt 1: "
                                              "every advantage will be 0"):
            check_zero_advantages(cfg)
    else:
        check_zero_advantages(cfg)


def test_allow_zero_advantages_flag_turns_the_refusal_into_a_warning(tiny_model_dir, tmp_path, caplog):
    p = write_lines(tmp_path / "p.jsonl", ['{"prompt": "q"}'])
    argv = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(p), "--rollout-batch-size", "1",
            "--n-samples-per-prompt", "1", "--advantage-estimator", "rloo", "--rm-type", "math"]
    with pytest.raises(ConfigError):
        check_zero_advantages(parse_config(argv, build_parser()))
    cfg = parse_config(argv + ["--allow-zero-advantages"], build_parser())
    assert cfg.allow_zero_advantages is True
    with caplog.at_level(logging.WARNING, logger="slick"):
        check_zero_advantages(cfg)
    assert "--advantage-estimator rloo with --n-samples-per-prompt 1: every advantage will be 0" in caplog.text
    assert "(--allow-zero-advantages: training anyway)" in caplog.text
