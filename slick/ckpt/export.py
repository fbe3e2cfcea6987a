"""`slick export CKPT_DIR OUT_DIR [--step N]`: turn a run checkpoint into a Hugging Face model directory.

A one-process checkpoint stores a complete HF directory (config, tokenizer with chat template, fp32
safetensors): export copies it. A sharded checkpoint (several trainer ranks, ``slick.ckpt.dcp``) stores the
fp32 weights as torch.distributed.checkpoint shards plus config and tokenizer: export gathers the shards in
this one process (no process group, any number of writer ranks) and writes the HF directory. Either way
export needs nothing but the checkpoint (no pickle is read), and the output is written atomically. A LoRA
checkpoint (``adapter/``, docs/lora.md) is merged into its base model (the run's --hf-checkpoint) by PEFT;
``--lora-adapter`` writes the PEFT adapter directory instead.

OUT_DIR must be new, empty, or an earlier ``slick export`` / ``--save-hf`` (it holds ``.slick-output.json``),
and must not be, contain or lie inside CKPT_DIR, another checkpoint or a run directory
(``slick.ckpt.output_dirs``); otherwise export exits 2 naming the problem, before any work and deleting nothing.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Optional

import torch

from slick.ckpt.checkpoint import HF_EXPORT, resolve_step_dir, write_dir_atomic
from slick.ckpt.dcp import export_sharded, is_sharded
from slick.ckpt.output_dirs import OutputDirError, export_problems
from slick.models.adapter_check import ADAPTER, ADAPTER_CONFIG
from slick.models.tokenizer import load_tokenizer


def export_checkpoint(load_root, out_dir, step: Optional[int] = None, lora_adapter: bool = False) -> Path:
    """HF model directory of a run checkpoint in ``out_dir``, atomically: a copy of a one-process checkpoint's
    ``model/`` (no model is loaded), or the fp32 weights gathered from a sharded one (``slick.ckpt.dcp``).
    ``out_dir`` is checked first (``output_dirs.export_problems``): not the checkpoint nor inside it, and new,
    empty or a previous slick export; OutputDirError otherwise, before any work."""
    problems = export_problems(load_root, out_dir)
    if problems:
        raise OutputDirError("; ".join(problems))
    s, d = resolve_step_dir(load_root, step)
    if lora_adapter or (d / "adapter").is_dir():   # a LoRA checkpoint (slick.train.lora): merged, or the adapter
        return write_dir_atomic(out_dir, lambda tmp: export_lora(d, tmp, lora_adapter), kind=HF_EXPORT)
    if is_sharded(d):
        return write_dir_atomic(out_dir, lambda tmp: export_sharded(d, tmp), kind=HF_EXPORT)
    src = d / "model"
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src}: checkpoint has no HF model (config.json missing)")

    def writer(tmp: Path) -> None:
        for f in src.iterdir():
            if f.is_file():
                shutil.copy2(f, tmp / f.name)

    return write_dir_atomic(out_dir, writer, kind=HF_EXPORT)


def export_lora(step_dir, out_dir, adapter_only: bool = False) -> None:
    """Export a LoRA checkpoint step (``adapter/``) into ``out_dir``: the PEFT adapter directory as saved
    (``adapter_only``), or a merged HF model in fp32: the base model (``model_path`` in ``trainer_state.json``,
    the run's --hf-checkpoint) with the adapter merged by PEFT's ``merge_and_unload``, and the base's tokenizer."""
    d = Path(step_dir)
    if not (d / "adapter" / ADAPTER_CONFIG).is_file():
        raise ValueError(f"{d}: not a LoRA checkpoint (no adapter/{ADAPTER_CONFIG}); --lora-adapter exports "
                         f"the adapter of a run trained with --lora-rank")
    if adapter_only:
        for f in (d / "adapter").iterdir():
            if f.is_file():
                shutil.copy2(f, Path(out_dir) / f.name)
        return
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = json.loads((d / "trainer_state.json").read_text())["model_path"]
    if not (Path(base) / "config.json").is_file():
        raise FileNotFoundError(f"{d}: a LoRA checkpoint holds the adapter only; its base model {base} "
                                f"(trainer_state.json model_path) is not a model directory any more")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(d / "adapter"), adapter_name=ADAPTER).merge_and_unload()
    merged.save_pretrained(str(out_dir))
    load_tokenizer(base).save_pretrained(str(out_dir))


def main(argv=None) -> int:
    """CLI entry point; returns the exit code."""
    ap = argparse.ArgumentParser(prog="slick export", description=__doc__.splitlines()[0])
    ap.add_argument("ckpt_dir", help="checkpoint root (with 'latest') or one step_XXXXXX directory, "
                                     "one-process or sharded")
    ap.add_argument("out_dir", help="HF model directory to write: new, empty, or an earlier slick export "
                                    "(anything else is refused, never overwritten)")
    ap.add_argument("--step", type=int, default=None, help="export this step instead of the latest")
    ap.add_argument("--lora-adapter", action="store_true",
                    help="a LoRA checkpoint: write its PEFT adapter directory instead of the merged model")
    args = ap.parse_args(argv)
    try:
        out = export_checkpoint(args.ckpt_dir, args.out_dir, args.step, lora_adapter=args.lora_adapter)
    except (FileNotFoundError, ValueError) as e:
        print(f"slick export: error: {e}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt_dir} -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
