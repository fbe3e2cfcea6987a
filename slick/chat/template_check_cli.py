"""`slick check-template MODEL_DIR [--cases N] [--seed S] [--json]`: does this model's chat template rewrite history?

Fuzzes ``--cases`` seeded conversations (system prompts, tools and tool results, reasoning blocks, 1-4 turns)
through the tokenizer's chat template, at the points a multi-turn rollout renders them
(:mod:`slick.chat.template_check`), and prints one line per conversation, then the verdict: prefix-preserving
(multi-turn rollouts concatenate the turns' tokens, one sample per episode) or rewriting (one training sample per
assistant turn), naming the first rewrite. ``--json`` prints the whole report as JSON instead.

Exit codes: 0 prefix-preserving, 1 the template rewrites earlier turns, 2 bad input (no such directory, no
tokenizer, no chat template, a template that renders none of the conversations).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slick.chat.template_check import TemplateReport, check_template
from slick.models.tokenizer import load_tokenizer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slick check-template", description="Fuzz conversations through a model's chat "
                                "template and report whether it preserves prefixes (token-exact concatenation of "
                                "multi-turn rollouts) or where it rewrites earlier turns. Exit code 0: "
                                "prefix-preserving, 1: rewrites, 2: bad input.")
    p.add_argument("model_dir", metavar="MODEL_DIR",
                   help="A local model directory with a tokenizer and a chat template.")
    p.add_argument("--cases", type=int, default=64, help="Number of fuzzed conversations (default: 64).")
    p.add_argument("--seed", type=int, default=0, help="Seed of the conversations (default: 0).")
    p.add_argument("--json", action="store_true", help="Print the whole report as JSON.")
    return p


def _fail(msg: str) -> int:
    print(f"slick check-template: {msg}", file=sys.stderr)
    return 2


def table(report: TemplateReport) -> str:
    """One line per conversation: turns, messages, features, text and token verdicts (the turn of the first
    rewrite or divergence)."""
    lines = [f"{'case':>4}  {'turns':>5}  {'msgs':>4}  {'features':<30}  {'text':<12}  tokens"]
    for c in report.cases:
        if c.error is not None:
            text, toks = "ERROR", c.error[:60]
        else:
            text = f"rewrite t{c.rewrite.turn}" if c.rewrite else "prefix"
            toks = "-" if c.rewrite else (f"differ t{c.token_divergence.turn}" if c.token_divergence else "prefix")
        lines.append(f"{c.case:>4}  {c.turns:>5}  {len(c.messages):>4}  {','.join(c.features) or '-':<30}  "
                     f"{text:<12}  {toks}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    path = Path(args.model_dir)
    if args.cases < 1:
        return _fail(f"--cases must be at least 1 (got {args.cases})")
    if not path.is_dir():
        return _fail(f"{path} is not a directory (MODEL_DIR is a local model directory; nothing is downloaded)")
    try:
        tok = load_tokenizer(path)
    except Exception as e:  # noqa: BLE001 - any loading failure is bad input, reported in one line
        return _fail(f"cannot load a tokenizer from {path}: {type(e).__name__}: {e}")
    if not getattr(tok, "chat_template", None):
        return _fail(f"the tokenizer in {path} has no chat template (tokenizer_config.json's chat_template or "
                     "chat_template.jinja)")
    report = check_template(tok, cases=args.cases, seed=args.seed)
    if not report.rendered:
        return _fail(f"the chat template of {path} rendered none of the {args.cases} conversations; first error: "
                     f"{report.errors[0].error}")
    if args.json:
        print(report.to_json())
    else:
        print(f"chat template of {path}: {args.cases} conversations, seed {args.seed} (tools in the template: "
              f"{'yes' if report.supports_tools else 'no'}; tool messages: {'yes' if report.tool_role else 'no'}; "
              f"system messages: {'yes' if report.system_role else 'no'})")
        print(table(report))
        if report.errors:
            print(f"{len(report.errors)} conversation(s) did not render; first: case {report.errors[0].case}: "
                  f"{report.errors[0].error}")
        print(report.verdict())
    return 0 if report.prefix_preserving else 1


if __name__ == "__main__":
    sys.exit(main())
