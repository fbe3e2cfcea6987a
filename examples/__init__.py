"""Runnable examples for slick (import them with the repository root on PYTHONPATH)."""
