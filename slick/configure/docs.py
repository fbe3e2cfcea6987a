"""`slick flags`: markdown reference of every config flag, generated from the typed groups.

``slick flags`` prints it; ``slick flags --write docs/flags.md`` writes the committed copy
(a test checks that the committed file equals the generated text, so the docs stay true).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from slick.config.groups import GROUPS
from slick.config.fields import field_choices, field_help, flag_name
from slick.configure.parse import _base_type
from slick.config.slime import CHANGES_MEANING, alias_rows, kept_rows

HEADER = """\
# slick flags

Generated from `slick/config/groups.py` (and `groups_megatron.py`) by `slick flags --write docs/flags.md`; do
not edit by hand (`tests/test_config.py` fails when this file and the code disagree). Flag names follow slime
where slime has the same option. Every flag is also a key of the resolved config: `cfg.<name>` (flat) or
`cfg.<group>.<name>`, with dashes turned into underscores.

## Config files: `--config`

`--config run.yaml` loads values from YAML before the flags are applied, so flags on the command
line override the file, and the file overrides the defaults. Keys may be flat or grouped by the
section names below, with dashes or underscores:

```yaml
# flat                          # grouped
prompt_data: data/train.jsonl   data:
rollout-batch-size: 16            prompt_data: data/train.jsonl
lr: 1.0e-6                      rollout:
                                  rollout_batch_size: 16
                                train:
                                  lr: 1e-6
```

Unknown keys are an error that names the file. Values are converted to the field's type
(`1e-6` is read as a float even though YAML 1.1 would keep it a string). The loop writes the fully
resolved config as `config.yaml` in the run directory; that file can be passed back to `--config`.

## Engine options: `--sglang-*`

Any flag `--sglang-KEY VALUE` (or `--sglang-KEY=VALUE`; a bare `--sglang-KEY` means `true`) is
collected into `cfg.sglang` as `{KEY: VALUE}` with dashes in `KEY` turned into underscores (for
example `--sglang-mem-fraction-static 0.8` gives `{"mem_fraction_static": "0.8"}`). A `sglang:`
mapping in the YAML file works the same way; flags win over the file key by key.

These options go to the engines slick launches itself: the in-process engine
(`--rollout-engine local`) and the `slick serve` workers started for `--rollout-engine http`
without `--rollout-urls`. Options with a meaning there are honoured; a warning names each one that
has none. SGLang servers you start yourself and pass with `--rollout-urls` do not receive them (a
warning says so): give those servers their own flags when you launch them.

## vLLM options: `--vllm-*`

`--vllm-KEY VALUE` flags are collected into `cfg.vllm` the same way and reach the vLLM servers slick
launches (`--rollout-engine vllm` without `--rollout-urls`) as vLLM's own `--KEY VALUE` (for example
`--vllm-max-num-seqs 128` becomes `--max-num-seqs 128`; a bare `--vllm-KEY` becomes `--KEY`). vLLM
checks them: a server that refuses an option ends the run at start-up with vLLM's error line quoted.

## Megatron-LM flags

slime passes Megatron-LM's own flags through, and its scripts carry them (`--num-layers`,
`--tensor-model-parallel-size`, `--recompute-activations`, ...). slick accepts the ones a slime
user brings, in the `megatron` group below: recompute flags turn on gradient checkpointing;
model-shape flags are checked against the checkpoint's `config.json` before anything loads (a
mismatch stops the run and shows both values); parallel sizes other than 1 are refused, because
slick's trainer is data-parallel only (FSDP2 ranks: `--actor-num-gpus-per-node`, docs/cluster.md).

## Batch-size constraint

One rollout step produces `rollout_batch_size x n_samples_per_prompt` samples, which are consumed
by `num_steps_per_rollout` optimizer steps of `global_batch_size` samples each:

    rollout_batch_size x n_samples_per_prompt = global_batch_size x num_steps_per_rollout

Give either `--global-batch-size` or `--num-steps-per-rollout` and the other is derived; give
neither and there is one optimizer step per rollout. When both are given and disagree, or the
given one does not divide the sample count, the run stops before loading any model with a message
that shows the numbers. All configuration problems are reported together, one per line.
"""

SLIME_USERS = """
## slime users

Flags slick shares with slime (`slime/utils/arguments.py`, and the Megatron-LM flags it passes
through) have slime's defaults, except those in the second table below, each with its reason;
`tests/slime_flags.py` holds the whole comparison as data and `tests/test_config_slime.py` checks
it. Where slime or Megatron spell a slick option differently, slime's spelling is accepted and lands
on slick's field (both spellings with different values is an error); slime flags slick cannot honour
are refused by name, saying what to use:

| slime's flag | in slick |
|---|---|"""

SLIME_KEPT = """
Defaults slick keeps where slime's differ (pass slime's value to get slime's behaviour). A command that reads as
a slime script (it gives a slime spelling above or a Megatron model-shape flag such as `--num-layers`) and leaves
out any of {flags} is warned at start-up, one line per flag, since the run would differ from slime's:

| slime's flag | slime's default | why slick's differs |
|---|---|---|"""


def _type_name(f: dataclasses.Field) -> str:
    meta = f.metadata
    tp = _base_type(f.type)
    choices = field_choices(f)
    if choices is not None:
        return "{" + ", ".join(map(str, choices)) + "}"
    if tp is bool:
        return "flag"
    if tp is list or meta.get("nargs"):
        inner = meta.get("type", str)
        return f"{inner.__name__} ..."
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def _fmt_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, dict)) and not value:
        return "empty"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """The whole flags reference as markdown text."""
    out = [HEADER]
    for gname, cls in GROUPS.items():
        out.append(f"\n## `{gname}`\n")
        out.append("| flag | type | default | meaning |")
        out.append("|---|---|---|---|")
        for f in dataclasses.fields(cls):
            meta = f.metadata
            if "flag" in meta and meta["flag"] is None:
                name, typ = f"--{f.name}-KEY VALUE", "str"
            else:
                name, typ = flag_name(f.name), _type_name(f)
            out.append(f"| `{name}` | {_cell(typ)} | {_cell(_fmt_default(_default(f)))} | {_cell(field_help(f))} |")
            if typ == "flag" and _default(f) is None:   # --flag / --no-flag, unset meaning automatic
                out.append(f"| `--no-{name[2:]}` | flag | unset | Turns `{name}` off (unset: chosen at start-up). |")
    out.append(SLIME_USERS)
    out.extend(f"| `{flag}` | {_cell(meaning)} |" for flag, meaning in alias_rows())
    out.append(SLIME_KEPT.format(flags=", ".join(f"`{f}`" for f in CHANGES_MEANING)))
    out.extend(f"| `{flag}` | {_cell(d)} | {_cell(why)} |" for flag, d, why in kept_rows())
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the flags reference, or write it with ``--write PATH``."""
    parser = argparse.ArgumentParser(prog="slick flags", description="Markdown reference of every config flag.")
    parser.add_argument("--write", metavar="PATH", default=None, help="Write the markdown to PATH instead of stdout.")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    text = render_markdown()
    if args.write:
        path = Path(args.write)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
