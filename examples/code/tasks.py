"""Small function-writing tasks with hidden tests, for ``--rm-type code``.

Each task asks for one Python function (``solve``) described in a sentence, e.g. "return the sum of the digits
of n, plus 3". Its label holds assert-style tests on inputs the prompt does not show
(``{"tests": "assert solve(38) == 14\\n..."}``), computed by a reference implementation here. Templates and a
parameter make the task; the held-out split uses (template, parameter) pairs the training split never has.
"""
from __future__ import annotations

import random
from typing import Callable

# (name, description with {k}, reference(x, k), input maker(rng)) ; inputs are ints, strings or int lists
TEMPLATES: list[tuple[str, str, Callable, Callable]] = [
    ("add", "returns n plus {k}", lambda n, k: n + k, lambda r: r.randint(-50, 50)),
    ("mul", "returns n multiplied by {k}", lambda n, k: n * k, lambda r: r.randint(-20, 20)),
    ("mod", "returns the remainder of n divided by {k}", lambda n, k: n % k, lambda r: r.randint(0, 99)),
    ("digits", "returns the sum of the decimal digits of n (n >= 0), plus {k}",
     lambda n, k: sum(map(int, str(n))) + k, lambda r: r.randint(0, 9999)),
    ("repeat", "returns the string s repeated {k} times", lambda s, k: s * k,
     lambda r: "".join(r.choice("abcxyz") for _ in range(r.randint(1, 4)))),
    ("count", "returns how many elements of the list xs are greater than {k}",
     lambda xs, k: sum(x > k for x in xs), lambda r: [r.randint(0, 20) for _ in range(r.randint(0, 8))]),
    ("shift", "returns the list xs with {k} added to every element", lambda xs, k: [x + k for x in xs],
     lambda r: [r.randint(-9, 9) for _ in range(r.randint(0, 6))]),
    ("last", "returns the last {k} characters of the string s (all of s when it is shorter)",
     lambda s, k: s[-k:], lambda r: "".join(r.choice("abcdef") for _ in range(r.randint(0, 8)))),
]
PARAMS = range(1, 10)
SYSTEM = ("You write Python. Answer with one function in a ```python code block and nothing else.")
N_TESTS = 4


def make_task(template: int, k: int, rng: random.Random) -> dict:
    name, text, ref, make_input = TEMPLATES[template]
    arg = "xs" if "xs" in text else "s" if "string s" in text else "n"
    inputs = [make_input(rng) for _ in range(N_TESTS)]
    tests = "\n".join(f"assert solve({x!r}) == {ref(x, k)!r}" for x in inputs)
    question = f"Write a Python function `solve({arg})` that {text.format(k=k)}."
    return {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "label": {"tests": tests}, "metadata": {"template": name, "k": k}}


def code_rows(n_train: int = 400, n_test: int = 24, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, test) rows; the test split's (template, k) pairs are disjoint from the training split's."""
    rng = random.Random(seed)
    pairs = [(t, k) for t in range(len(TEMPLATES)) for k in PARAMS]
    rng.shuffle(pairs)
    n_test_pairs = max(1, len(pairs) // 6)
    test_pairs, train_pairs = pairs[:n_test_pairs], pairs[n_test_pairs:]
    test = [make_task(*test_pairs[i % len(test_pairs)], rng) for i in range(n_test)]
    train = [make_task(*train_pairs[i % len(train_pairs)], rng) for i in range(n_train)]
    rng.shuffle(train)
    return train, test
