"""`slick train`: synchronous RL. rollout -> buffer -> advantages + train -> weight sync -> save/eval/log.

The held-out evaluation of step n's weights runs beside step n + 1's rollout (the engines hold the same weights
for both, and decode them in the same batches); step n is logged, with its evaluation, once that is done. Where
the rollout may abort the engine's requests (a dynamic-sampling filter) or is not the engine's (a custom rollout
function, SFT), and after the last step, the evaluation runs on its own (``Run.evaluates_beside_rollout``).

Synchronous training is the buffer with max_staleness 0: every sample taken for step n was generated
by the weights of step n (``--update-weights-interval k > 1`` lets the engines lag k - 1 rollout steps
behind, and raises the buffer's staleness bound to match). `slick train-async` (loop/train_async.py) is the
asynchronous driver on the same Run phases.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Optional

from slick.cluster.layout import ClusterFailure
from slick.config import Config, ConfigError
from slick.configure import build_parser, parse_config
from slick.data.dataset import DataError
from slick.engines.client import EngineError
from slick.engines.fault import EngineDied
from slick.loop.run import Run
from slick.loop.step import NonFiniteTrainingError
from slick.proc.children import until_sigterm
from slick.ckpt.checkpoint import CheckpointWriteError
from slick.ckpt.safe_load import UnsafeCheckpointError

log = logging.getLogger("slick")


def due(step: int, interval, last: int) -> bool:
    return step == last or bool(interval) and step % interval == 0


def tokens_per_sec(metrics: dict, seconds: float) -> float:
    """``perf/tokens_per_sec`` of a step that took ``seconds``: the tokens the rollout sampled
    (``rollout/generated_tokens``) or, for an SFT step, which samples none, the chats' trained tokens
    (``rollout/sft_trained_tokens``: their loss-mask tokens), per second of the step."""
    tokens = metrics.get("rollout/generated_tokens")
    if tokens is None:
        tokens = metrics.get("rollout/sft_trained_tokens", 0)
    return float(tokens) / max(seconds, 1e-9)


async def train(cfg: Config) -> Run:
    run = Run(cfg)
    rollout_parts, steps = run.rollout_parts, run.steps
    held = None   # an evaluation held to run beside the next rollout (evaluate, start_held, log_held)
    try:
        await run.start()
        if steps.start == 0 and rollout_parts.eval_sets:
            held = await evaluate(run, 0, {}, beside=steps.start < steps.stop)
        for step in range(steps.start, steps.stop):
            watch = run.watch_step(step)           # lines inside a long step, until cancelled
            t0 = time.perf_counter()
            rollout = asyncio.ensure_future(run.rollout(step))
            held = start_held(held)                # after the rollout: the engine's queue serves the rollout first
            groups, metrics = await rollout
            t_held = time.perf_counter()
            held = await log_held(run, held)
            t0 += time.perf_counter() - t_held     # perf/step_time leaves out the evaluation, as it always did
            if cfg.load_debug_rollout_data:  # a replay is trained on as saved, whatever policy generated it
                batch = groups
            else:
                rollout_parts.buffer.put(groups)
                batch = rollout_parts.buffer.take(len(groups), run.version)
                if len(batch) < len(groups):
                    log.warning("step %d: training on %d of %d groups (stale ones dropped, or kept back by "
                                "--buffer-filter-path): %s", step, len(batch), len(groups),
                            rollout_parts.buffer.stats())
            if not cfg.debug_rollout_only:
                metrics.update(await run.probe_mismatch(step, batch))   # engines and trainer hold the same weights here
                syncs = (step + 1) % cfg.update_weights_interval == 0
                if syncs and cfg.offload_rollout:
                    metrics.update(await run.offload_rollout())
                metrics.update(await run.train_off_loop(step, batch))
                if syncs:
                    metrics.update(await run.sync_weights())
                    metrics.update(await run.check_weights())
            if rollout_parts.engines:
                metrics.update(rollout_parts.engines.fault_metrics())   # fault/* with --use-fault-tolerance
            metrics["perf/step_time"] = time.perf_counter() - t0
            metrics["perf/tokens_per_sec"] = tokens_per_sec(metrics, metrics["perf/step_time"])
            watch.cancel()
            if run.outputs.timeline is not None:
                metrics.update(run.outputs.timeline.take())   # engine busy fraction, reward waits overlapped/exposed
            done = step + 1
            # checkpoints every --save-interval and after the last step; --save-hf exports with each
            # checkpoint, or after the last step only when there is no --save
            if (cfg.save or cfg.save_hf) and due(done, cfg.save_interval if cfg.save else None, steps.stop):
                run.save(done)
            if rollout_parts.eval_sets and due(done, cfg.eval_interval, steps.stop):
                held = await evaluate(run, done, metrics, beside=done < steps.stop)
            else:
                run.log(metrics, done)
    finally:
        if held is not None and held[0] is not None:   # the run ended early (an error, SIGTERM): so does its evaluation
            held[0].cancel()
            await asyncio.gather(held[0], return_exceptions=True)
        await run.close()
    return run


async def evaluate(run: Run, step: int, metrics: dict, beside: bool):
    """The held-out evaluation of the weights after ``step``. With ``beside`` (a rollout follows) and where the
    rollout allows it (``Run.evaluates_beside_rollout``) it is held, ``(None, run.evaluate, step, metrics)``: the
    loop starts it once the next rollout has started (:func:`start_held`) and logs ``step`` with it
    (:func:`log_held`). Otherwise it runs now and ``step`` is logged with its ``metrics``; returns None."""
    held = (None, run.evaluate, step, metrics)
    if beside and run.evaluates_beside_rollout:
        return held
    return await log_held(run, start_held(held))


def start_held(held):
    """Start a held evaluation (None: nothing held)."""
    if held is None:
        return None
    _, fn, step, metrics = held
    return asyncio.ensure_future(fn()), fn, step, metrics


async def log_held(run: Run, held) -> None:
    """Wait for a started held evaluation (or None) and log its step's metrics with it; returns None."""
    if held is not None:
        task, _, step, metrics = held
        run.log({**metrics, **await task}, step)


def main(argv=None, prog: str = "slick train", defaults: Optional[dict] = None) -> int:
    """``prog`` names the command in messages; ``defaults``: values below --config and flags (slick sft's)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = parse_config(argv, build_parser(prog), defaults=defaults)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2

    try:   # SIGTERM shuts down like Ctrl-C: Run.close stops the workers, router, Ray cluster
        run = asyncio.run(until_sigterm(train(cfg), prog))
    except (NonFiniteTrainingError, ClusterFailure, EngineDied, EngineError, CheckpointWriteError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except (DataError, UnsafeCheckpointError) as e:   # bad prompt data or checkpoint file: named in the message
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except (asyncio.CancelledError, KeyboardInterrupt) as e:
        sigterm = isinstance(e, asyncio.CancelledError)
        print(f"{prog}: stopped ({'SIGTERM' if sigterm else 'interrupted'}); resume with --load", file=sys.stderr)
        return 143 if sigterm else 130
    print(f"run directory: {run.outputs.run_dir}")
    return 0
