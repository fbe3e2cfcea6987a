"""InterruptibleEngine.wait_idle (what a train-async step waits for when trainer and engine share the cores),
on a real LocalEngine with a tiny model."""
import asyncio

import pytest

from slick.engine.local import LocalEngine
from slick.rollout.interrupt import InterruptibleEngine
from slick.types import SamplingParams

SP = SamplingParams(temperature=1.0, max_new_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = LocalEngine(tiny_model_dir, dtype="fp32", max_running=4)
    yield eng
    eng.close_sync()


def test_returns_once_every_request_and_one_about_to_start_are_done(engine):
    ie = InterruptibleEngine(engine)

    async def main():
        now = [asyncio.ensure_future(ie.generate([1, 2, 3, i], SP)) for i in range(3)]

        async def late():        # made 10 ms after the engine went idle (as a group just admitted would be)
            await asyncio.gather(*now)
            await asyncio.sleep(0.01)
            return await ie.generate([1, 2, 3], SP)
        later = asyncio.ensure_future(late())
        await asyncio.sleep(0)
        assert ie.busy()
        waited = await ie.wait_idle(30, settle=0.05)
        return waited, [t.done() for t in now + [later]], ie.busy(), [len(t.result().token_ids) for t in now + [later]]

    waited, done, busy, lengths = asyncio.run(main())
    assert done == [True] * 4 and not busy and lengths == [16] * 4
    assert waited >= 0.05


def test_returns_at_once_when_idle_and_times_out_naming_the_wait(engine):
    ie = InterruptibleEngine(engine)

    async def main():
        quick = await ie.wait_idle(5, settle=0.01)
        await engine.pause_generation()
        stuck = asyncio.ensure_future(ie.generate([4, 5, 6], SP))
        await asyncio.sleep(0)
        try:
            with pytest.raises(TimeoutError, match=r"--async-timeout\) for the engine's 1 requests in flight"):
                await ie.wait_idle(0.3)
        finally:
            await engine.continue_generation()
        await stuck
        return quick

    assert asyncio.run(main()) < 0.5
