"""A hand-made run directory with a rollout store and metrics.jsonl, for the store's readers (slick rollouts,
slick rescore, slick inspect).

Two steps of 4 addition questions x 2 samples. The run's "verifier" was a lenient one: it paid 1.0 to any
response that says "the answer is", right or wrong (reward hacking). The exact answers: sample i answers
``a + b`` unless i is 2 or 5 (``a + b + 1``); i = 3 and 7 forget the phrase; i = 5 also carries a tool turn
(loss mask 0 on tokens 2-4). So per step the lenient verifier pays 2 wrong answers (i = 2, 5: reward hacking)
and misses 2 right ones (i = 3, 7), against the gsm8k verifier.
"""
import json

from slick.observe.store import RolloutStore
from slick.types import Sample, Status

LENIENT_RM = '''
def says_answer(args, sample):
    return 1.0 if "the answer is" in sample.response else 0.0
'''


class CharTokenizer:
    """One character per token id (ids are code points), enough for `response_tokens`."""

    def decode(self, ids):
        return "".join(chr(t) for t in ids)


def sample(step: int, i: int) -> Sample:
    a, b = i, 10 + step
    right = i % 3 != 2
    answer = a + b if right else a + b + 1
    says = i % 4 != 3                                       # every 4th sample forgets the phrase
    text = f"the answer is {answer}" if says else f"{answer}"
    ids = [ord(c) for c in text]
    mask = [1] * len(ids)
    if i == 5:
        mask[2:5] = [0, 0, 0]                               # a tool's reply inside the response
    return Sample(index=8 * (step - 1) + i, group_index=4 * (step - 1) + i // 2, prompt_index=i // 2, epoch=0,
                  prompt=f"What is {a} + {b}?", label=str(a + b), prompt_ids=[1, 2, 3], response_ids=ids,
                  response=text, rollout_logprobs=[-0.1 * (k % 7) for k in range(len(ids))], loss_mask=mask,
                  reward=1.0 if says else 0.0, status=Status.COMPLETED, weight_versions=[step - 1] * len(ids),
                  timings={"reward_time": 0.001})


def make_run(run_dir, steps=(1, 2)):
    """Write the store and metrics.jsonl; returns the samples by step."""
    store = RolloutStore(run_dir, tokenizer=CharTokenizer())
    out = {}
    for step in steps:
        samples = [sample(step, i) for i in range(8)]
        store.write(step, samples, [float(s.reward) for s in samples], train_versions=[step] * 8)
        out[step] = samples
    with open(f"{run_dir}/metrics.jsonl", "a") as f:
        for step in steps:
            rewards = [s.reward for s in out[step]]
            f.write(json.dumps({"step": step, "time": 1000.0 + step, "rollout/raw_reward": sum(rewards) / 8,
                                "rollout/response_len/mean": sum(len(s.response_ids) for s in out[step]) / 8,
                                "train/loss": 0.5 / step, "rollout/staleness/mean": 1.0}) + "\n")
    return out
