"""Search example: a BM25 search tool over a small generated corpus of fictional towns."""
