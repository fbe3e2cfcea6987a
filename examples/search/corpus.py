"""A small corpus of fictional towns, generated from a seed, and questions answered by it.

The towns do not exist, so a model cannot know the answers and has to search. Each town has one
document stating its province, founding year, population and river; each question asks for one
number from one document. ``build_corpus()`` is deterministic (same seed, same corpus), so the
search tool and the data generator agree without shipping a file.
"""
from __future__ import annotations

import random

SYLLABLES = ["ka", "lo", "mer", "vin", "tor", "sa", "bel", "dra", "qui", "nor", "ves", "ha", "lum", "rid",
             "pa", "zen", "ostr", "ul", "fen", "gar"]
PROVINCES = ["Kesh", "Aldmoor", "Varn", "Tessaly", "Oskar Reach", "Pellin"]
RIVERS = ["Ambril", "Corve", "Duna", "Esk", "Falow", "Grent", "Hollin", "Isset"]
QUESTIONS = {
    "founded": "In what year was the town of {name} founded?",
    "population": "What is the population of {name}?",
}


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()


def build_corpus(n_towns: int = 200, seed: int = 0) -> list[dict]:
    """``[{"id", "name", "title", "text", "founded", "population", "province", "river"}, ...]``, names unique."""
    rng = random.Random(seed)
    names: list[str] = []
    seen = set()
    while len(names) < n_towns:
        name = _name(rng)
        if name not in seen:
            seen.add(name)
            names.append(name)
    docs = []
    for i, name in enumerate(names):
        founded, population = rng.randint(1100, 1950), rng.randint(800, 95000)
        province, river = rng.choice(PROVINCES), rng.choice(RIVERS)
        text = (f"{name} is a town in the province of {province}, on the river {river}. "
                f"{name} was founded in {founded}. The population of {name} is {population}.")
        docs.append({"id": i, "name": name, "title": name, "text": text, "founded": founded,
                     "population": population, "province": province, "river": river})
    return docs


def question_rows(docs: list[dict]) -> list[dict]:
    """One row per (town, question kind): ``{"question", "label", "metadata"}`` with the number as label."""
    rows = []
    for doc in docs:
        for kind, template in QUESTIONS.items():
            rows.append({"question": template.format(name=doc["name"]), "label": str(doc[kind]),
                         "metadata": {"doc_id": doc["id"], "kind": kind}})
    return rows
