"""--prometheus-port: real short runs (tiny random model, in-process engine) serve /metrics over HTTP with the
values they trained; every PromQL query of dashboards/slick.json names a metric such a run exports."""
import asyncio
import json
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.loop.run import Run
from slick.loop.sync import train
from slick.loop.train_async import train_async
from slick.observe.prometheus import TARGETS_FILE, metric_name
from tests.test_loop import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "dashboards" / "slick.json"

REWARD_MODULE = '''
def rm(args, sample):
    """Fraction of even token ids; sample 5 fails (one reward failure to count)."""
    if sample.index == 5:
        raise RuntimeError("sample 5 always fails")
    ids = sample.response_ids
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)
'''


@pytest.fixture()
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "prom_rm.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(12)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_cfg(model_dir, prompts, run_dir, driver="sync", **over):
    values = dict(hf_checkpoint=str(model_dir), prompt_data=str(prompts), rollout_batch_size=2,
                  n_samples_per_prompt=4, rollout_max_response_len=8, custom_rm_path="prom_rm.rm",
                  lr=1e-3, num_rollout=3, dtype="fp32", run_dir=str(run_dir), no_progress=True, seed=3,
                  rollout_seed=5, micro_batch_size=4, prometheus_port=0)
    values.update(over)
    return validate_config(Config.from_flat(values), driver=driver)


def scraping(monkeypatch) -> dict:
    """Scrape the run's real endpoint right after each step is logged: {step: exposition text}."""
    scrapes = {}
    log = Run.log

    def log_and_scrape(self, metrics, step):
        log(self, metrics, step)
        with urllib.request.urlopen(self.outputs.exporter.url, timeout=10) as r:
            scrapes[step] = r.read().decode()
        scrapes["url"] = self.outputs.exporter.url

    monkeypatch.setattr(Run, "log", log_and_scrape)
    return scrapes


def samples_of(text) -> dict:
    """{(name, frozenset(labels)): value} of an exposition text."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def assert_closed(url):
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)


def test_sync_run_serves_what_it_trained(tiny_model_dir, reward_module, tmp_path, monkeypatch):
    scrapes = scraping(monkeypatch)
    run = asyncio.run(train(make_cfg(tiny_model_dir, reward_module, tmp_path / "run",
                                     save_debug_rollout_data=str(tmp_path / "dbg"))))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    s1, s3 = samples_of(scrapes[1]), samples_of(scrapes[3])
    assert value(s1, "slick_trained_samples_total") == 8 and value(s3, "slick_trained_samples_total") == 24
    assert value(s3, "slick_trained_tokens_total") == sum(r["rollout/generated_tokens"] for r in rows)
    assert value(s3, "slick_steps_total") == 3 and value(s3, "slick_step") == 3
    assert value(s3, "slick_trainer_version") == 3 == run.train_parts.trainer.version
    assert value(s3, "slick_engine_up", engine="local") == 1
    assert value(s3, "slick_engine_weight_version", engine="local") == 3
    # the step gauges are the metrics.jsonl values, exactly
    for key in ("perf/step_time", "perf/train_time", "perf/rollout_time", "perf/update_weights_time",
                "perf/tokens_per_sec", "rollout/raw_reward", "train/loss"):
        assert value(s3, metric_name(key)) == rows[-1][key], key
    assert metric_name("perf/step_time") == "slick_perf_step_time_seconds"
    # synchronous training: every trained sample is 0 versions old
    assert value(s3, "slick_rollout_staleness_count") == 24
    assert value(s3, "slick_rollout_staleness_bucket", le="0.0") == 24
    assert value(s3, "slick_rollout_request_latency_seconds_count") == 24
    assert value(s3, "slick_reward_scored_total", reward_type="custom") == 24
    assert value(s3, "slick_reward_failed_total", reward_type="custom") == 1     # sample 5
    assert value(s3, "slick_reward_latency_seconds_count", reward_type="custom") == 24
    assert value(s3, "slick_buffer_put_groups_total") == 6 and value(s3, "slick_buffer_groups") == 0
    assert value(s3, "slick_buffer_oldest_group_age_seconds") == 0.0
    assert value(s3, "slick_process_rss_bytes", rank="driver") > 50e6
    port = int(scrapes["url"].split(":")[2].split("/")[0])
    targets = json.loads((tmp_path / "run" / TARGETS_FILE).read_text())
    assert targets == [{"targets": [f"127.0.0.1:{port}"], "labels": {"job": "slick-train"}}]
    assert_closed(scrapes["url"])          # the endpoint ends with the run
    # the verifier evidence of every sample is in the debug rollout dump
    dumped = read_jsonl(tmp_path / "dbg" / "rollout_0.jsonl")
    assert [d["index"] for d in dumped] == list(range(8))
    assert all(d["evidence"]["reward_type"] == "custom" and d["evidence"]["function"] == "prom_rm.rm" for d in dumped)
    assert [d["evidence"]["error"] for d in dumped] == [None] * 5 + ["RuntimeError: sample 5 always fails"] + [None] * 2
    assert [d["evidence"]["reply"] for d in dumped if d["index"] != 5] == [d["reward"] for d in dumped if d["index"] != 5]


@pytest.fixture()
def async_exposition(tiny_model_dir, reward_module, tmp_path, monkeypatch):
    scrapes = scraping(monkeypatch)
    cfg = make_cfg(tiny_model_dir, reward_module, tmp_path / "run", driver="async", max_staleness=1,
                   use_tis=True)
    asyncio.run(train_async(cfg))
    assert_closed(scrapes["url"])
    return scrapes


def test_async_run_staleness_and_dashboard_queries(async_exposition):
    s3 = samples_of(async_exposition[3])
    # --max-staleness 1: step 0 trains on version-0 samples, steps 1 and 2 on samples one version old
    assert value(s3, "slick_rollout_staleness_bucket", le="0.0") == 8
    assert value(s3, "slick_rollout_staleness_bucket", le="1.0") == 24
    assert value(s3, "slick_trained_samples_total") == 24
    assert value(s3, "slick_trainer_version") == 3
    families = re.findall(r"^# TYPE (\S+)", async_exposition[3], re.M)
    assert len(families) == len(set(families)), families       # every family once
    exported = {name for name, _ in s3}
    queries = dashboard_queries()
    assert len(queries) >= 12
    for expr in queries:
        names = set(re.findall(r"\b((?:slick|process)_[a-zA-Z0-9_]+)\b", expr))
        assert names, f"dashboard query names no metric: {expr}"
        missing = names - exported
        assert not missing, f"dashboard query {expr!r} names {sorted(missing)}, not exported by a real run"


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = []

    def walk(panels):
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(board["panels"])
    return exprs


def test_dashboard_is_grafana_json():
    board = json.loads(DASHBOARD.read_text())
    assert board["title"] and board["uid"] and board["schemaVersion"] >= 30
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert any(v.get("name") == "DS_PROMETHEUS" or v.get("type") == "datasource"
               for v in board["templating"]["list"])


def test_bad_port_is_refused(tiny_model_dir, reward_module, tmp_path):
    with pytest.raises(ConfigError, match="--prometheus-port must be in 0..65535"):
        make_cfg(tiny_model_dir, reward_module, tmp_path / "run", prometheus_port=70000)


def test_port_in_use_stops_the_run_at_start_naming_the_flag(tiny_model_dir, reward_module, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"--prometheus-port {port}: cannot serve /metrics on 127.0.0.1:{port}"):
            asyncio.run(train(make_cfg(tiny_model_dir, reward_module, tmp_path / "run", prometheus_port=port)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_engine_up_and_version_per_engine_from_real_slick_serve(tiny_model_dir, tmp_path):
    from slick.engines.router import launch_workers
    from slick.observe.prometheus import RunExporter

    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240)
    dead = f"http://127.0.0.1:{free_port()}"        # nothing listens there
    exporter = None
    try:
        exporter = RunExporter(tmp_path, engine_urls=[w.url, dead])
        with urllib.request.urlopen(exporter.url, timeout=10) as r:
            s = samples_of(r.read().decode())
        assert value(s, "slick_engine_up", engine=w.url) == 1
        assert value(s, "slick_engine_weight_version", engine=w.url) == 0
        assert value(s, "slick_engine_up", engine=dead) == 0
        assert ("slick_engine_weight_version", frozenset({("engine", dead)})) not in s
        with urllib.request.urlopen(w.url + "/metrics", timeout=10) as r:    # the engine's own /metrics
            assert value(samples_of(r.read().decode()), "slick_process_rss_bytes") > 50e6
        targets = json.loads((tmp_path / TARGETS_FILE).read_text())
        assert targets[1] == {"targets": [w.url.split("//")[1], dead.split("//")[1]],
                              "labels": {"job": "slick-engine"}}
        w.stop()
        with urllib.request.urlopen(exporter.url, timeout=10) as r:
            assert value(samples_of(r.read().decode()), "slick_engine_up", engine=w.url) == 0
    finally:
        w.stop()
        if exporter is not None:
            exporter.close()
    assert_closed(exporter.url)


@pytest.mark.slow
def test_ray_ranks_and_engine_actors_reach_the_drivers_endpoint(tmp_path, monkeypatch):
    """2 trainer ranks and 2 engine actors on a local Ray cluster: each rank's RSS and call times and each
    engine's up/version are on the driver's one /metrics; the engines are listed for file_sd."""
    from tests.test_cluster_ray import make_cfg as ray_cfg
    from tests.test_loop import learnable_task

    model, prompts = learnable_task(tmp_path, monkeypatch)
    cfg = ray_cfg(model, prompts, tmp_path / "run", rollout_num_gpus=2, num_rollout=1, prometheus_port=0)

    async def go():
        run = Run(cfg)
        try:
            groups, metrics = await run.rollout(0)
            metrics.update(await run.train_off_loop(0, groups))
            metrics.update(await run.sync_weights())
            run.log(metrics, 1)
            with urllib.request.urlopen(run.outputs.exporter.url, timeout=30) as r:
                return run, run.rollout_parts.engines.worker_urls, r.read().decode()
        finally:
            await run.close()

    run, urls, text = asyncio.run(asyncio.wait_for(go(), 400))
    s = samples_of(text)
    assert len(set(urls)) == 2
    for url in urls:
        assert value(s, "slick_engine_up", engine=url) == 1
        assert value(s, "slick_engine_weight_version", engine=url) == 1
    for rank in ("0", "1"):
        assert value(s, "slick_process_rss_bytes", rank=rank) > 50e6
        assert value(s, "slick_trainer_rank_call_seconds", rank=rank, method="train_step") > 0
    assert value(s, "slick_trained_samples_total") == 32 and value(s, "slick_trainer_version") == 1
    targets = json.loads((tmp_path / "run" / TARGETS_FILE).read_text())
    assert targets[1] == {"targets": [u.split("//")[1] for u in urls], "labels": {"job": "slick-engine"}}
    assert_closed(run.outputs.exporter.url)


def test_step_metrics_never_shadow_the_fixed_families(tmp_path):
    from slick.observe.prometheus import FAMILIES, RunExporter

    x = RunExporter(tmp_path)
    try:
        x.observe_step({"buffer/groups": 5.0, "perf/step_time": 2.5, "trained/samples": 7.0, "eval/h-pass@4": 0.5,
                        "rollout/staleness/hist/1": 3, "note": "text"}, 4)
        with urllib.request.urlopen(x.url, timeout=10) as r:
            text = r.read().decode()
        s = samples_of(text)
    finally:
        x.close()
    assert value(s, "slick_perf_step_time_seconds") == 2.5 and value(s, "slick_eval_h_pass_4") == 0.5
    assert value(s, "slick_step") == 4 and value(s, "slick_steps_total") == 1
    assert ("slick_buffer_groups", frozenset()) not in s          # no buffer here: the family is the buffer's own
    assert value(s, "slick_trained_samples_total") == 0          # the counter, not the step's trained/samples
    assert not any("hist" in name or name == "slick_note" for name, _ in s)
    assert len(set(FAMILIES)) == len(FAMILIES)
    families = re.findall(r"^# TYPE (\S+)", text, re.M)
    assert len(families) == len(set(families)), families       # no family twice
