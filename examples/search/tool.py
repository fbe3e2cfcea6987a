"""The ``search`` tool: BM25 over the generated town corpus, and its schema (OpenAI function format).

Use it with the multi-turn rollout by dotted path: ``--tool-path examples.search.tool:TOOLS`` (run from the
repository root or put it on ``PYTHONPATH``). The corpus is rebuilt from its seed on first use;
``SLICK_SEARCH_TOWNS`` / ``SLICK_SEARCH_SEED`` pick another corpus (the data generator takes the same).
The query is policy-written text: longer than :data:`MAX_QUERY_CHARS` it is refused with an error message, so
one call costs a few milliseconds at most.
"""
from __future__ import annotations

import functools
import os

from examples.search.bm25 import BM25
from examples.search.corpus import build_corpus

SEARCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search an encyclopedia of towns; returns the best matching passages.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "words to look for, e.g. a town name"}},
            "required": ["query"],
        },
    },
}
MAX_RESULTS = 3
MAX_QUERY_CHARS = 1000


@functools.lru_cache(maxsize=4)
def _index(n_towns: int, seed: int) -> tuple[list[dict], BM25]:
    docs = build_corpus(n_towns, seed)
    return docs, BM25([d["text"] for d in docs])


def _corpus_settings() -> tuple[int, int]:
    return int(os.environ.get("SLICK_SEARCH_TOWNS", "200")), int(os.environ.get("SLICK_SEARCH_SEED", "0"))


def search(query: str, top_k: int = 2) -> str:
    """The ``top_k`` (1..3) best passages for ``query``, one per line, or a message saying none matched."""
    if not isinstance(query, str) or not query.strip():
        return "error: query must be a non-empty string"
    if len(query) > MAX_QUERY_CHARS:
        return f"error: query longer than {MAX_QUERY_CHARS} characters (got {len(query)})"
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        return "error: top_k must be an integer"
    docs, index = _index(*_corpus_settings())
    hits = index.top(query, max(1, min(MAX_RESULTS, top_k)))
    if not hits:
        return "no results"
    return "\n".join(docs[i]["text"] for i, _ in hits)


TOOLS = [search]
