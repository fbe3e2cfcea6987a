"""Drivers that wire the rooms together: ``sync.py`` (synchronous RL). They hold no math."""
