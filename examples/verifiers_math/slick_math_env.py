"""A verifiers 0.4.0 environment for slick's example: one-digit addition with one retry.

verifiers loads an environment by id as an importable module exporting its ``Taskset`` (and optionally ``Env``)
subclass in ``__all__``; with this folder on ``PYTHONPATH`` the id is ``slick_math_env``
(``--environment verifiers:slick_math_env``). Usually an environment is a pip-installed package; this one is a file
so that the example needs nothing but verifiers.

* Taskset: 2000 questions ``What is A + B?`` from a ``datasets.Dataset`` (seeded, no download), each with a
  system prompt asking for the answer between ``<answer>`` tags.
* Rubric: ``correct`` (1.0 when the last reply's ``<answer>`` is the sum) and ``tagged`` (0.1 weight: the reply
  has the tags at all).
* Env: a wrong or untagged first reply gets one more turn with feedback; a right one ends the episode.
"""
import random
import re

import datasets
import verifiers.v1 as vf

SYSTEM = "Answer with the number only, between <answer> and </answer>."
FEEDBACK = "That is not it. Think again and give only the number between <answer> and </answer>."
N_TASKS = 2000


def rows(n: int = N_TASKS, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        out.append({"id": f"add-{i}", "prompt": f"What is {a} + {b}?", "answer": str(a + b)})
    return out


def extract(reply: str):
    found = re.findall(r"<answer>\s*(.*?)\s*</answer>", reply or "", re.S)
    return found[-1] if found else None


class MathData(vf.TaskData):
    answer: str


class MathTask(vf.Task[MathData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return 1.0 if extract(trace.last_reply) == task.answer else 0.0

    @vf.reward(weight=0.1)
    async def tagged(self, task, trace) -> float:
        return 0.0 if extract(trace.last_reply) is None else 1.0


class MathTaskset(vf.Taskset[MathTask, vf.TasksetConfig]):
    def load(self):
        for row in datasets.Dataset.from_list(rows()):
            yield MathTask(MathData(id=row["id"], prompt=row["prompt"], answer=row["answer"], system_prompt=SYSTEM),
                           self.config.task)


class RetryEnv(vf.Env[vf.SingleAgentEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            segment = await interaction.turn()
            if not segment.terminated and extract(segment.last_reply) != task.data.answer:
                await interaction.turn(FEEDBACK)


__all__ = ["MathTaskset", "RetryEnv"]
