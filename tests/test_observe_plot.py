"""Tests for `slick plot`: PNGs written from metrics.jsonl, plotted data equals the logged metrics."""
import struct

import pytest

from slick.observe.metrics import MetricsLogger, read_metrics
from slick.observe.plot import build_figures, figure_specs, main, plot_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def _write_run(run_dir, with_kl=True):
    with MetricsLogger(run_dir) as log:
        for step in range(1, 6):
            m = {"rollout/raw_reward": 0.1 * step, "rollout/response_len/mean": 20.0 + step,
                 "perf/rollout_time": 1.0 + step, "perf/train_time": 2.0, "perf/update_weights_time": 0.5,
                 "perf/eval_time": 0.25, "perf/step_time": 3.75 + step, "perf/tokens_per_sec": 100.0}
            if with_kl:
                m.update({"train/ppo_kl": 0.01 * step, "train/kl_loss": 0.02 * step})
            if step % 2 == 0:
                m.update({"eval/addition": 0.2 * step, "eval/addition-pass@4": 0.25 * step})
            log.log(m, step=step)


def test_plot_run_writes_pngs(tmp_path):
    _write_run(tmp_path / "run")
    paths = plot_run(tmp_path / "run")
    names = sorted(p.name for p in paths)
    assert names == ["eval.png", "kl.png", "response_len.png", "reward.png", "step_time.png"]
    for p in paths:
        assert p.parent == tmp_path / "run" / "plots"
        assert png_size(p) == (640, 400)                 # figsize 6.4 x 4.0 in at 100 dpi


def test_figure_data_matches_metrics(tmp_path):
    import matplotlib.pyplot as plt

    _write_run(tmp_path / "run")
    rows = read_metrics(tmp_path / "run")
    figs = build_figures(rows)
    try:
        (line,) = figs["reward.png"].axes[0].get_lines()
        assert list(line.get_xdata()) == [1, 2, 3, 4, 5]
        assert list(line.get_ydata()) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
        evals = {l.get_label(): (list(l.get_xdata()), list(l.get_ydata())) for l in figs["eval.png"].axes[0].get_lines()}
        assert evals == {"eval/addition": ([2, 4], pytest.approx([0.4, 0.8])),
                         "eval/addition-pass@4": ([2, 4], pytest.approx([0.5, 1.0]))}
        kls = {l.get_label(): list(l.get_ydata()) for l in figs["kl.png"].axes[0].get_lines()}
        assert kls["train/ppo_kl"] == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
        assert kls["train/kl_loss"] == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.10])
        # stacked split: rollout, train, update_weights, then other perf/*_time; total line on top
        ax = figs["step_time.png"].axes[0]
        tops = [coll.get_paths()[0].vertices[:, 1].max() for coll in ax.collections]
        # cumulative tops at the last step (rollout 6.0, +2, +0.5, +0.25)
        assert tops == pytest.approx([6.0, 8.0, 8.5, 8.75])
        (total,) = ax.get_lines()
        assert list(total.get_ydata()) == pytest.approx([4.75, 5.75, 6.75, 7.75, 8.75])
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend[:4] == ["rollout_time", "train_time", "update_weights_time", "eval_time"]
    finally:
        for f in figs.values():
            plt.close(f)
    specs = figure_specs(rows)
    assert specs["step_time.png"] == ["perf/rollout_time", "perf/train_time", "perf/update_weights_time",
                                      "perf/eval_time"]


def test_missing_metrics_skip_with_note(tmp_path, capsys):
    _write_run(tmp_path / "run", with_kl=False)
    rc = main([str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "skipping kl.png" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "eval.png", "response_len.png", "reward.png", "step_time.png"]


def test_missing_metrics_file_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "empty" / "metrics.jsonl") in err


def test_corrupt_metrics_exit_2(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "rollout/raw_reward": 0.5}\n{oops}\n')
    assert main([str(tmp_path)]) == 2
    assert "metrics.jsonl:2" in capsys.readouterr().err


def test_cli_dispatch(tmp_path):
    from slick.cli import main as slick_main

    _write_run(tmp_path / "run")
    assert slick_main(["plot", str(tmp_path / "run")]) == 0
    assert png_size(tmp_path / "run" / "plots" / "reward.png") == (640, 400)


def test_activity_plot_for_train_async_runs():
    rows = [{"step": s, "perf/train_time": 2.0, "perf/trainer_idle_time": 0.5 * s, "perf/rollout_idle_time": 1.0,
             "perf/paused_time": 0.1, "perf/step_time": 2.6 + 0.5 * s} for s in (1, 2, 3)]
    specs = figure_specs(rows)
    assert specs["activity.png"] == ["perf/train_time", "perf/trainer_idle_time", "perf/rollout_idle_time",
                                     "perf/paused_time"]
    assert "perf/rollout_idle_time" not in specs["step_time.png"]      # overlaps the step: not one of its parts
    figs = build_figures(rows)
    try:
        lines = {l.get_label(): list(l.get_ydata()) for l in figs["activity.png"].axes[0].get_lines()}
        assert lines["perf/trainer_idle_time"] == [0.5, 1.0, 1.5]
    finally:
        import matplotlib.pyplot as plt

        for f in figs.values():
            plt.close(f)
    sync_rows = [{"step": 1, "perf/train_time": 2.0, "perf/step_time": 3.0}]
    assert figure_specs(sync_rows)["activity.png"] == []
