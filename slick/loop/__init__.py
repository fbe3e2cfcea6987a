"""The training loop: the synchronous driver (``sync.py``), the Run whose phases it calls (``run.py``), the
training phase (``step.py``: rewards -> ``slick.algo`` -> Trainer) and debug dumps (``debug.py``). No math here."""
