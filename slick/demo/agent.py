"""`make demo-agent` / `python -m slick.demo agent`: SmolLM2-135M-Instruct learns to use a calculator, on CPU.

The task is 3-digit x 2-digit multiplication (``slick.demo.calculator``), which the 135M model cannot do
alone. Each prompt has a system message (the calculator's schema is rendered into it by the multi-turn
rollout), one worked example of the call format and the question; the policy gets two turns (call, then
answer) and the reward is the correctness of the last assistant turn's number. The demo

1. measures the base model's held-out accuracy *without* the tool (plain question, same sampling),
2. trains GRPO with the built-in multi-turn tool rollout, evaluating the held-out questions *with* the tool
   at T=1.0 before training and every ``--eval-interval`` steps,
3. prints a table, writes a plot and a summary (``summary.json``) to the run directory.

Extra arguments are ``slick train`` flags and override the demo's defaults.
"""
from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path

from slick.config import ConfigError
from slick.configure import build_parser, parse_config
from slick.demo.calculator import QUESTION, write_calculator_data
from slick.engine.local import LocalEngine
from slick.loop.sync import train
from slick.models.smollm2 import prepare_smollm2
from slick.observe.metrics import read_metrics
from slick.reward.gsm8k import score
from slick.types import SamplingParams

N_TEST = 40
DEFAULTS = {
    "--rollout-batch-size": "4", "--n-samples-per-prompt": "8", "--rollout-max-response-len": "64",
    "--max-turns": "2", "--max-tokens-per-turn": "24", "--tool-path": "slick.demo.calculator:TOOLS",
    "--tool-parser": "slick.demo.calculator:parse_expression_call",
    "--tool-key": "tools", "--custom-rm-path": "slick.demo.calculator.final_answer_reward",
    "--rollout-temperature": "1.0", "--advantage-estimator": "grpo", "--lr": "2e-5", "--lr-warmup-steps": "0",
    "--num-rollout": "8", "--eval-interval": "4", "--n-samples-per-eval-prompt": "1", "--eval-temperature": "1.0",
    "--micro-batch-size": "16", "--rollout-shuffle": None, "--apply-chat-template": None,
    "--run-dir": "runs/demo-agent", "--seed": "1", "--offload-rollout": None,
}
NO_TOOL_SUFFIX = " Answer with just the number."


def agent_argv(model_dir: Path, data_dir: Path, extra: list[str]) -> list[str]:
    train, test = write_calculator_data(data_dir, n_test=N_TEST)
    argv = ["--hf-checkpoint", str(model_dir), "--prompt-data", str(train), "--eval-prompt-data", "heldout", str(test)]
    for flag, value in DEFAULTS.items():
        if flag not in extra:
            argv += [flag] if value is None else [flag, value]
    return argv + extra


async def accuracy_without_tool(model_dir: Path, test_path: Path, n_samples: int, temperature: float,
                                max_new_tokens: int = 24, seed: int = 0) -> float:
    """Mean correctness of the held-out questions asked plainly (no tool, no example), ``n_samples`` each."""
    rows = [json.loads(line) for line in test_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    engine = LocalEngine(model_dir, seed=seed)
    try:
        tok = engine.tokenizer

        async def one(row: dict, i: int) -> float:
            meta = row["metadata"]
            msgs = [{"role": "user", "content": QUESTION.format(a=meta["a"], b=meta["b"]) + NO_TOOL_SUFFIX}]
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
            sp = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed * 100003 + i,
                                stop_token_ids=[tok.eos_token_id])
            gen = await engine.generate([int(t) for t in ids], sp)
            return score(tok.decode(gen.token_ids, skip_special_tokens=True), row["label"])

        scores = await asyncio.gather(*[one(r, i * n_samples + j) for i, r in enumerate(rows)
                                        for j in range(n_samples)])
    finally:
        await engine.close()
    return sum(scores) / len(scores)


def eval_rows(run_dir: Path) -> list[dict]:
    rows = read_metrics(run_dir)
    tool_calls = {r["step"]: r.get("rollout/tool_calls/mean") for r in rows if "rollout/tool_calls/mean" in r}
    return [{"step": r["step"], "accuracy": r["eval/heldout"], "pass@k": r.get(next(
        (k for k in r if k.startswith("eval/heldout-pass@")), ""), float("nan")),
        "train_tool_calls": tool_calls.get(r["step"])} for r in rows if "eval/heldout" in r]


def print_table(rows: list[dict], no_tool: float, k: int) -> None:
    print(f"\n held-out accuracy, 3-digit x 2-digit multiplication, T=1.0 (base model without the tool: {no_tool:.1%})")
    print(f" step | with the tool | pass@{k}")
    print("------+---------------+-------")
    for r in rows:
        print(f" {r['step']:>4} | {r['accuracy']:>13.1%} | {r['pass@k']:.1%}")
    if rows:
        print(f"\nwith the tool: {rows[0]['accuracy']:.1%} -> {rows[-1]['accuracy']:.1%}; "
              f"without it (base model): {no_tool:.1%}")


def plot(rows: list[dict], no_tool: float, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot([r["step"] for r in rows], [100 * r["accuracy"] for r in rows], "o-", label="with the calculator")
    ax.axhline(100 * no_tool, color="grey", ls="--", label="base model, no tool")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("held-out accuracy (%), T=1.0")
    ax.set_ylim(-2, 102)
    ax.set_title("SmolLM2-135M learns to use a calculator (CPU)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_results(run_dir: Path, results_dir: Path, img: Path, conditions: str = "") -> tuple[Path, Path]:
    """``agent_demo.json`` / ``agent_demo.md`` under ``results_dir`` and the plot at ``img``, from a finished run's
    ``summary.json`` and ``metrics.jsonl`` (what ``bench/results`` and the README show)."""
    import shutil

    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    steps = [r for r in read_metrics(run_dir) if "perf/step_time" in r]
    mean = lambda key: sum(r.get(key, 0.0) for r in steps) / max(len(steps), 1)  # noqa: E731
    summary["steps"] = [{"step": r["step"], "raw_reward": r.get("rollout/raw_reward"),
                         "tool_calls": r.get("rollout/tool_calls/mean"), "turns": r.get("rollout/turns/mean"),
                         "step_time_s": r.get("perf/step_time")} for r in steps]
    summary["mean_step_s"] = {k: round(mean(f"perf/{k}"), 1) for k in ("step_time", "rollout_time", "train_time",
                                                                         "update_weights_time")}
    summary["conditions"] = conditions
    results_dir.mkdir(parents=True, exist_ok=True)
    out_json = results_dir / "agent_demo.json"
    out_json.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    evals = summary["eval"]
    k = next((a for f, a in zip(summary["argv"], summary["argv"][1:]) if f == "--n-samples-per-eval-prompt"), "?")
    lines = ["# Agent demo: SmolLM2-135M-Instruct learns to use a calculator (CPU)", "",
             "`python -m slick.demo agent` (`make demo-agent`). " + conditions, "",
             f"Held-out: {N_TEST} 3-digit x 2-digit products x {k} samples, T=1.0. Base model *without* the tool: "
             f"**{summary['no_tool_accuracy']:.1%}**.", "",
             "| step | held-out accuracy with the tool | pass@%s | tool calls per sample (training rollouts) |" % k,
             "|---|---|---|---|"]
    for r in evals:
        calls = r.get("train_tool_calls")
        lines.append(f"| {r['step']} | {r['accuracy']:.1%} | {r['pass@k']:.1%} | "
                     f"{'' if calls is None else f'{calls:.2f}'} |")
    ms = summary["mean_step_s"]
    lines += ["", f"Wall time {summary['wall_time_s']:.0f} s in all (model load, the no-tool evaluation "
              f"{summary['no_tool_eval_s']:.0f} s, training and every evaluation {summary['train_s']:.0f} s); mean step "
              f"{ms['step_time']} s = rollout {ms['rollout_time']} s + training {ms['train_time']} s + weight sync "
              f"{ms['update_weights_time']} s.", "", "Command line given to `slick train`:", "",
              "```", " ".join(summary["argv"]), "```", ""]
    out_md = results_dir / "agent_demo.md"
    out_md.write_text("\n".join(lines), encoding="utf-8")
    img.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / "plots" / "agent_eval.png", img)
    return out_json, out_md


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    t0 = time.perf_counter()
    extra = list(sys.argv[1:] if argv is None else argv)
    # another --hf-checkpoint (given last, it wins) makes preparing SmolLM2 unnecessary
    model_dir = Path(extra[extra.index("--hf-checkpoint") + 1]) if "--hf-checkpoint" in extra else prepare_smollm2()
    run_dir = Path(extra[extra.index("--run-dir") + 1]) if "--run-dir" in extra else Path(DEFAULTS["--run-dir"])
    try:
        cfg = parse_config(agent_argv(model_dir, run_dir / "data", extra), build_parser("slick demo agent"))
    except ConfigError as e:
        print(f"slick demo agent: {e}", file=sys.stderr)
        return 2
    run_dir = Path(cfg.run_dir)
    k = cfg.n_samples_per_eval_prompt
    print(f"[slick demo agent] GRPO with a calculator tool, SmolLM2-135M-Instruct, {cfg.num_rollout} steps, "
          f"run directory {run_dir}", flush=True)
    t_base = time.perf_counter()
    no_tool = asyncio.run(accuracy_without_tool(Path(cfg.hf_checkpoint), run_dir / "data" / "test.jsonl", k,
                                                cfg.eval_temperature, seed=cfg.seed))
    t_base = time.perf_counter() - t_base
    print(f"[slick demo agent] base model without the tool: {no_tool:.1%} held-out accuracy "
          f"({N_TEST} questions x {k}, {t_base:.0f} s)", flush=True)
    t_train = time.perf_counter()
    asyncio.run(train(cfg))
    t_train = time.perf_counter() - t_train
    rows = eval_rows(run_dir)
    print_table(rows, no_tool, k)
    png = plot(rows, no_tool, run_dir / "plots" / "agent_eval.png")
    wall = time.perf_counter() - t0
    summary = {"no_tool_accuracy": no_tool, "eval": rows, "wall_time_s": round(wall, 1),
               "no_tool_eval_s": round(t_base, 1), "train_s": round(t_train, 1),
               "argv": agent_argv(model_dir, run_dir / "data", extra)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(f"plot: {png}\nwall time {wall:.0f} s (training run with evaluations {t_train:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
