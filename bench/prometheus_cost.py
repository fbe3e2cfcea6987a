"""Exporter costs (slick/observe/prometheus.py): observe_* per 256-sample batch and one /metrics scrape (a buffer
of 64 groups, 60 step gauges). Run: .venv/bin/python bench/prometheus_cost.py"""
import tempfile, time, urllib.request
from slick.data.buffer import RolloutBuffer
from slick.observe.prometheus import RunExporter
from slick.types import Sample, Status

buf = RolloutBuffer(max_staleness=4)
d = tempfile.mkdtemp()
x = RunExporter(d, buffer=buf)
samples = [Sample(index=i, response_ids=list(range(256)), weight_versions=[3] * 256, status=Status.COMPLETED,
                  timings={"generate": 0.5}, evidence={"reward_type": "math", "seconds": 0.001, "error": None})
           for i in range(256)]
buf.put([samples[i:i + 4] for i in range(0, 256, 4)])
metrics = {f"train/m{i}": float(i) for i in range(50)} | {f"perf/t{i}_time": 1.0 for i in range(10)}
t0 = time.perf_counter(); n = 50
for _ in range(n):
    x.observe_trained(samples, 5); x.observe_generated(samples)
    for s in samples: x.observe_reward(s)
    x.observe_step(metrics, 1)
per_batch = (time.perf_counter() - t0) / n
t0 = time.perf_counter(); m = 50
for _ in range(m):
    body = urllib.request.urlopen(x.url).read()
scrape = (time.perf_counter() - t0) / m
x.close()
print(f"observe (256 samples: trained+generated+reward, 60 step gauges): {per_batch*1e3:.2f} ms per batch")
print(f"scrape: {scrape*1e3:.2f} ms, {len(body)} bytes")
