"""Run checkpoints on disk: atomic step directories, retention, resume, sharded (DCP) state, RNG state, safe
loading, the output-directory policy, and ``slick export`` (HF directories, merged or adapter-only LoRA).

Below ``train``: a checkpoint takes any object with the trainer's ``save``/``load``. Import submodules directly.
"""
