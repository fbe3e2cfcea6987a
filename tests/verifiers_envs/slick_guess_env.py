"""A small verifiers 0.4.0 environment for slick's tests (importable by id once this folder is on sys.path):
a taskset of four "say N" tasks built from a datasets.Dataset, a rubric (exact answer: 1.0; the reply's length in
words as a 0.5-weighted metric-like reward), and a multi-turn Env that answers a wrong reply with "Wrong, try
again." up to three replies. Task 3's run raises once the policy answered (a broken environment)."""
import datasets
import verifiers.v1 as vf

ROWS = [{"prompt": f"Say the number {i}.", "answer": str(i)} for i in range(4)]


class GuessData(vf.TaskData):
    answer: str


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def exact(self, task, trace) -> float:
        return 1.0 if trace.last_reply == task.answer else 0.0


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for row in datasets.Dataset.from_list(ROWS):
            yield GuessTask(GuessData(prompt=row["prompt"], answer=row["answer"],
                                      system_prompt="Answer with the number only."), self.config.task)


class GuessEnv(vf.Env[vf.SingleAgentEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as it:
            segment = await it.turn()
            replies = 0
            while not segment.terminated:
                replies += 1
                if task.data.answer == "3":
                    raise RuntimeError("the game server fell over")
                if segment.last_reply == task.data.answer or replies >= 3:
                    break
                segment = await it.turn("Wrong, try again.")
        it.trace.record_reward("replies", float(replies), 0.5)


__all__ = ["GuessTaskset", "GuessEnv"]
