"""`slick train-async`: rollout and training overlap through the buffer (docs/async.md).

A producer (slick/rollout/producer.py) keeps generating groups into the buffer, paced so that no trained
token is more than --max-staleness versions old; the trainer takes a batch, trains on its own thread, and
pushes weights through the interruptible engine (--async-weight-update wait | continue | resubmit).
The same Run phases as `slick train`; --max-staleness 0 gives the batches of `slick train`.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import Counter

from slick.cluster.layout import ClusterFailure
from slick.config import Config, ConfigError
from slick.configure import build_parser, parse_config
from slick.configure.validate import async_lead
from slick.data.dataset import DataError
from slick.engines.client import EngineError
from slick.engines.fault import EngineDied
from slick.loop.run import Run
from slick.loop.step import NonFiniteTrainingError
from slick.loop.sync import due, tokens_per_sec
from slick.proc.children import until_sigterm
from slick.rollout.producer import Producer
from slick.ckpt.checkpoint import CheckpointWriteError
from slick.ckpt.safe_load import UnsafeCheckpointError

log = logging.getLogger("slick")


def staleness_metrics(batch, train_version: int) -> dict:
    """rollout/staleness/*: per sample, the trainer's version minus the version of its oldest token."""
    samples = [s for g in batch for s in g if s.weight_versions]
    lags = [train_version - min(s.weight_versions) for s in samples]
    tokens = sum(len(s.weight_versions) for s in samples)
    old = sum(1 for s in samples for v in s.weight_versions if v < train_version)
    m = {"rollout/staleness/mean": sum(lags) / max(len(lags), 1), "rollout/staleness/max": max(lags, default=0),
         "rollout/offpolicy_token_frac": old / max(tokens, 1)}
    m.update({f"rollout/staleness/hist/{lag}": n for lag, n in sorted(Counter(lags).items())})
    return m


async def train_async(cfg: Config) -> Run:
    # built for overlap (slick/loop/build.py): the buffer's staleness backstop, the interruptible engine
    # (rollout_parts.engine) in the rollout manager, the trainer's thread budget (slick/loop/threads.py)
    run = Run(cfg, overlap=True)
    rollout_parts, threads, steps = run.rollout_parts, run.train_parts.threads, run.steps
    engine = rollout_parts.engine
    producer = Producer(cfg, rollout_parts.manager, rollout_parts.buffer, rollout_parts.data, engine,
                        lead=async_lead(cfg), synced_steps=steps.start, consumed_steps=steps.start,
                        num_steps=steps.stop)
    try:
        await run.start()
        producer.start()
        if steps.start == 0 and rollout_parts.eval_sets:
            run.log(await run.evaluate(), 0)
        last, filtered = time.perf_counter(), 0
        for step in range(steps.start, steps.stop):
            watch = run.watch_step(step)           # lines inside a long step, until cancelled
            t0 = time.perf_counter()
            batch = await producer.take(run.version, cfg.async_timeout)
            metrics = {"perf/trainer_idle_time": time.perf_counter() - t0}
            # perf/rollout_time: seconds between two batches becoming ready (the rollout side's period)
            metrics.update(rollout_parts.manager.rollout_metrics(batch, producer.filtered - filtered,
                                                                 time.perf_counter() - last))
            last, filtered = time.perf_counter(), producer.filtered
            metrics.update(staleness_metrics(batch, run.version))
            if threads.share_cores:          # one set of cores: the next batch is generated with all of them
                # first, then the step takes them while those groups wait for rewards (slick/loop/threads.py)
                metrics["perf/trainer_yield_time"] = await engine.wait_idle(cfg.async_timeout)
            with threads.training():         # the engine's share of the cores while the trainer runs
                metrics.update(await run.train_off_loop(step, batch))
            done = step + 1
            if done % cfg.update_weights_interval == 0:
                paused0 = engine.paused_time
                if cfg.async_weight_update == "wait":          # one-step-off: let the rollouts in flight finish
                    await producer.drain(cfg.async_timeout)
                metrics.update(await engine.update(run.sync_weights))
                metrics.update(await run.check_weights())   # the engine generates again: the probe can run
                metrics.update(await run.probe_mismatch(step, batch))
                producer.weights_synced(done)
                producer.resume()
                metrics["perf/paused_time"] = engine.paused_time - paused0
            metrics["perf/step_time"] = time.perf_counter() - t0    # as slick train's: evaluation and saving apart
            metrics["perf/tokens_per_sec"] = tokens_per_sec(metrics, metrics["perf/step_time"])
            watch.cancel()
            if rollout_parts.eval_sets and due(done, cfg.eval_interval, steps.stop):
                metrics.update(await run.evaluate())
            if (cfg.save or cfg.save_hf) and due(done, cfg.save_interval if cfg.save else None, steps.stop):
                await producer.quiesce(cfg.async_timeout)      # untrained groups go into the checkpoint
                run.save(done)
                producer.resume()
            metrics.update(rollout_parts.buffer.stats())
            metrics.update({"perf/rollout_idle_time": producer.take_idle_time(),
                            "rollout/resubmitted_requests": engine.resubmitted})
            metrics.update(rollout_parts.engines.fault_metrics())   # fault/* with --use-fault-tolerance
            metrics.update(run.outputs.timeline.take())    # engine busy fraction, reward waits overlapped/exposed
            metrics.update(producer.groups_in_flight())
            run.log(metrics, done)
    finally:
        await producer.stop()
        await run.close()
    return run


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = parse_config(argv, build_parser("slick train-async"), driver="async")
    except ConfigError as e:
        print(f"slick train-async: {e}", file=sys.stderr)
        return 2

    try:   # SIGTERM shuts down like Ctrl-C: Run.close stops the workers, router, Ray cluster
        run = asyncio.run(until_sigterm(train_async(cfg), "slick train-async"))
    except (NonFiniteTrainingError, TimeoutError, ClusterFailure, EngineDied, EngineError, CheckpointWriteError) as e:
        print(f"slick train-async: error: {e}", file=sys.stderr)
        return 1
    except (DataError, UnsafeCheckpointError) as e:   # bad prompt data or checkpoint file: named in the message
        print(f"slick train-async: {e}", file=sys.stderr)
        return 2
    except (asyncio.CancelledError, KeyboardInterrupt) as e:
        sigterm = isinstance(e, asyncio.CancelledError)
        print(f"slick train-async: stopped ({'SIGTERM' if sigterm else 'interrupted'}); resume with --load", file=sys.stderr)
        return 143 if sigterm else 130
    print(f"run directory: {run.outputs.run_dir}")
    return 0
