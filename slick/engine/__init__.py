"""Rollout engines behind one protocol (see ``base.Engine``)."""
