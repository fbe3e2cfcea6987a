"""Lines inside a long step (slick/observe/step_progress.py) and the trainer's pass counter they read."""
import asyncio

from slick.observe.step_progress import StepWatch
from slick.train.trainer import Trainer
from tests.test_train import make_cfg, make_samples


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_rollout_lines_count_tokens_and_bound_the_eta():
    clock, tokens, work = Clock(), [5000], [None]
    w = StepWatch(print, lambda: tokens[0], lambda: work[0], samples=4, max_tokens=8192, total_steps=10, clock=clock)
    w.begin(2)
    clock.t += 60
    tokens[0] += 3000                     # 50 tok/s; at most 4 x 8192 = 32,768: 29,768 left -> 595 s at most
    assert w.line() == ("step 3/10, 01:00 in: rollout, 3,000 tokens generated (50 tok/s; 4 responses of <= 8,192 "
                        "tokens), eta <= 09:55")
    work[0] = ("training", 0, 8)          # the trainer's pass begins: micro-batches, no pace yet
    clock.t += 30
    assert w.line() == "step 3/10, 01:30 in: training, micro-batch 1 of 8"
    work[0] = ("training", 3, 8)          # 3 done in 45 s: 15 s each, 5 left
    clock.t += 45
    assert w.line() == "step 3/10, 02:15 in: training, micro-batch 4 of 8, eta 01:15"
    work[0] = ("actor logprobs", 0, 2)    # a new pass restarts the pace
    assert w.line() == "step 3/10, 02:15 in: actor logprobs, micro-batch 1 of 2"


def test_engines_elsewhere_say_only_how_long_the_rollout_has_run():
    clock = Clock()
    w = StepWatch(print, lambda: None, lambda: None, samples=4, max_tokens=64, total_steps=3, clock=clock)
    w.begin(0)
    clock.t += 3725
    assert w.line() == "step 1/3, 1:02:05 in: rollout"


def test_watch_writes_after_the_delay_and_every_period_until_cancelled():
    lines = []

    async def go():
        w = StepWatch(lines.append, lambda: 0, lambda: None, 1, 8, 1, after=0.05, period=0.05)
        task = asyncio.ensure_future(w.watch(0))
        await asyncio.sleep(0.02)
        assert lines == []                # a short step prints nothing
        await asyncio.sleep(0.16)
        task.cancel()
        n = len(lines)
        await asyncio.sleep(0.1)
        return n

    n = asyncio.run(go())
    assert 2 <= n <= 4 and len(lines) == n and lines[0].startswith("step 1/1, 00:00 in: rollout, 0 tokens")


def test_the_trainer_says_which_micro_batch_of_which_pass_is_under_way(tiny_model_dir):
    seen = []
    tr = None

    def budget():
        seen.append(tr.work)
        return None

    tr = Trainer(make_cfg(tiny_model_dir, micro_batch_size=2), thread_budget=budget)
    samples = make_samples(6, seed=1)
    assert tr.work is None
    tr.compute_logprobs(samples)
    assert seen == [("actor logprobs", i, 3) for i in range(3)] and tr.work is None
