"""Build the on-policy distillation teacher a config asks for (slick/train/opd_teacher.py): the trainer's frozen
forward (``--opd-type trainer``/``megatron``), or an engine that is never updated (``--opd-type engine``/``sglang``):
a server at ``--opd-teacher-url`` (SGLang's API: slick serve, SGLang, sglang-router; or vLLM's), else an
in-process LocalEngine on ``--opd-teacher-load`` in the run's ``--dtype``."""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

from slick.config import Config, ConfigView
from slick.engine.local import LocalEngine
from slick.engines.client import HttpEngine
from slick.engines.detect import server_kind
from slick.engines.vllm_client import VllmEngine
from slick.train.opd_teacher import EngineTeacher, TrainerTeacher

log = logging.getLogger("slick")
ENGINE_TYPES = ("engine", "sglang")     # --opd-type values of a teacher served by an engine


def make_teacher(cfg: Config | ConfigView, trainer, train_pool) -> Optional[object]:
    """The run's teacher (None without --use-opd). ``train_pool``: the executor of the training thread, where
    the trainer's teacher forward runs. Reads the sft_distill, data, rollout and train groups."""
    cfg = cfg.view("sft_distill", "data", "rollout", "train")
    if not cfg.use_opd:
        return None
    if cfg.opd_type not in ENGINE_TYPES:
        return TrainerTeacher(trainer, lambda fn, *a: asyncio.get_running_loop().run_in_executor(train_pool, fn, *a))
    if cfg.opd_teacher_url:
        url = cfg.opd_teacher_url.rstrip("/")
        kind = server_kind(url)
        if kind == "unknown":
            raise ValueError(f"--opd-teacher-url {url}: no server answers SGLang's /get_model_info or vLLM's "
                             "/weight_info there (start the teacher first: slick serve, SGLang or vLLM)")
        client = VllmEngine if kind == "vllm" else HttpEngine
        log.info("on-policy distillation teacher: the %s server at %s", kind, url)
        return EngineTeacher(client([url], concurrency=cfg.rollout_concurrency, timeout=cfg.rollout_timeout))
    log.info("on-policy distillation teacher: an in-process engine on %s", cfg.opd_teacher_load)
    engine = LocalEngine(cfg.opd_teacher_load, dtype=cfg.dtype, device=cfg.device, max_running=1,
                         seed=cfg.rollout_seed)
    return EngineTeacher(engine, concurrency=1)
