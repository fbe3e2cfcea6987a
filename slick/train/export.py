"""`slick export CKPT_DIR OUT_DIR [--step N]`: turn a run checkpoint into a Hugging Face model directory.

A one-process checkpoint stores a complete HF directory (config, tokenizer with chat template, fp32
safetensors): export copies it. A sharded checkpoint (several trainer ranks, ``slick.train.dcp``) stores the
fp32 weights as torch.distributed.checkpoint shards plus config and tokenizer: export gathers the shards in
this one process (no process group, any number of writer ranks) and writes the HF directory. Either way
export needs nothing but the checkpoint (no pickle is read), and the output is written atomically. A LoRA
checkpoint (``adapter/``, docs/lora.md) is merged into its base model (the run's --hf-checkpoint) by PEFT;
``--lora-adapter`` writes the PEFT adapter directory instead.

OUT_DIR must be new, empty, or an earlier ``slick export`` / ``--save-hf`` (it holds ``.slick-output.json``),
and must not be, contain or lie inside CKPT_DIR, another checkpoint or a run directory
(``slick.train.output_dirs``); otherwise export exits 2 naming the problem, before any work and deleting nothing.
"""
from __future__ import annotations

import argparse
import sys

from slick.train.checkpoint import export_checkpoint


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
