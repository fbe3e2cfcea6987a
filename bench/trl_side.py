"""The TRL side of the slick-vs-TRL benchmark: TRL's GRPOTrainer on the addition demo task, on CPU.

Same model (SmolLM2-135M-Instruct), task (single-digit addition, chat prompts), batch (8 prompts x 8
completions per optimizer step), sampling (T=1.0, no top-k/top-p), reward rule (last number of the
completion equals the label) and held-out evaluation (T=1.0, max 48 new tokens, bf16, HF generate) as
slick's demo, so `bench/vs_trl.py` can put the two side by side.

TRL settings: use_vllm=False, use_cpu, bf16 mixed precision (fp32 master weights, bf16 autocast),
beta=0 (no KL, no reference model), num_iterations=1, constant LR, TRL's default loss ("dapo") and group
reward scaling. One optimizer step = ``prompts_per_step * samples_per_prompt`` completions, generated
once and trained in micro-batches of ``micro_batch_size`` (gradient accumulation).

Measured: per step wall time, a generation/train split (generation ends when TRL calls the reward
function), completions/s and generated tokens/s (completion tokens incl. EOS, over the step wall time
and over the generation phase), held-out accuracy every ``eval_every`` steps, training wall time (eval
excluded) until held-out accuracy first reaches ``target_acc`` (None if never), final accuracy, peak RSS.
Per step metrics also go to ``out_dir/metrics.jsonl`` under slick's metric names (``slick plot`` works).

Smoke run: ``python bench/trl_side.py --steps 2`` (prints a table, writes bench/results/trl_side.json).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_NUM = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The number after the last ``####`` if any, else the last number in ``text`` (commas dropped)."""
    text = text or ""
    if "####" in text:
        m = _NUM.search(text.rsplit("####", 1)[1])
        if m:
            return float(m.group().replace(",", ""))
    found = _NUM.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def addition_reward(completion: str, label: str) -> float:
    """1.0 when the completion's final number equals the label's number, else 0.0."""
    pred, gold = last_number(completion), last_number(str(label))
    return 1.0 if pred is not None and gold is not None and pred == gold else 0.0


def _completion_text(c) -> str:
    # conversational datasets give [{"role": "assistant", "content": ...}]; plain ones give a str
    if isinstance(c, list):
        return "".join(m.get("content", "") or "" for m in c)
    return str(c)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file; a bad line raises ValueError naming file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{i}: bad JSON: {e}") from None
    for i, r in enumerate(rows, start=1):
        if "prompt" not in r or "label" not in r:
            raise ValueError(f"{path}: row {i} needs 'prompt' and 'label' fields, has {sorted(r)}")
    return rows


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def evaluate(model, tokenizer, rows: list[dict], *, max_new_tokens=48, temperature=1.0, batch_size=64,
             seed=0, bf16=True) -> float:
    """Held-out accuracy: sample one answer per row at ``temperature`` (HF generate; bf16 autocast if ``bf16``)
    on the model's device."""
    import torch

    was_training = model.training
    model.eval()
    rng = torch.get_rng_state()  # keep the training RNG stream untouched by eval sampling
    torch.manual_seed(seed)
    pad_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    correct = 0
    try:
        for i in range(0, len(rows), batch_size):
            chunk = rows[i:i + batch_size]
            texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                     for r in chunk]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            with torch.no_grad(), torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16):
                out = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                     max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
            for r, ids in zip(chunk, out[:, enc["input_ids"].shape[1]:]):
                text = tokenizer.decode(ids, skip_special_tokens=True)
                correct += addition_reward(text, r["label"])
    finally:
        tokenizer.padding_side = pad_side
        torch.set_rng_state(rng)
        model.train(was_training)
    return correct / max(len(rows), 1)


def run_trl(model_dir, train_jsonl, test_jsonl, *, steps=30, prompts_per_step=8, samples_per_prompt=8,
            max_new_tokens=48, temperature=1.0, lr=2e-5, eval_every=5, seed=0, out_dir="runs/trl_side",
            micro_batch_size=16, target_acc=0.8, threads=None, gradient_checkpointing=False,
            bf16=True, device="cpu", log=print) -> dict:
    """Train with TRL's GRPOTrainer and return the measurements (see the module docstring) as a dict.

    ``threads`` sets torch's intra-op threads (None keeps torch's default). On a shared, oversubscribed
    CPU fewer threads can be many times faster; give both sides of a comparison the same value.
    ``gradient_checkpointing`` is off by default (TRL turns it on; it costs compute and a 135M model
    does not need the memory saving). ``bf16=False`` trains and evaluates in fp32. ``device`` "cuda" trains and
    generates on the GPU (TRL's ``use_cpu=False``).
    """
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from slick.observe.metrics import MetricsLogger

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    completions_per_step = prompts_per_step * samples_per_prompt
    if completions_per_step % micro_batch_size:
        raise ValueError(f"micro_batch_size={micro_batch_size} must divide {completions_per_step} completions per step")
    grad_accum = completions_per_step // micro_batch_size
    train_rows, test_rows = read_jsonl(train_jsonl), read_jsonl(test_jsonl)
    dataset = Dataset.from_list([{"prompt": r["prompt"], "label": str(r["label"])} for r in train_rows])

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)

    state = {"tokens": 0, "completions": 0, "rewards": [], "gen_end": None, "step_begin": None}

    def reward_fn(prompts, completions, completion_ids, label, **kwargs):
        state["gen_end"] = time.perf_counter()
        rewards = [addition_reward(_completion_text(c), y) for c, y in zip(completions, label)]
        state["tokens"] += sum(len(ids) for ids in completion_ids)
        state["completions"] += len(completions)
        state["rewards"] += rewards
        return rewards

    reward_fn.__name__ = "addition_reward"

    config = GRPOConfig(
        output_dir=str(out_dir / "trl"), use_cpu=device == "cpu", bf16=bf16, seed=seed, data_seed=seed,
        max_steps=steps, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        per_device_train_batch_size=micro_batch_size, gradient_accumulation_steps=grad_accum,
        steps_per_generation=grad_accum, num_generations=samples_per_prompt, num_iterations=1,
        max_completion_length=max_new_tokens, temperature=temperature, top_p=1.0, top_k=0,
        beta=0.0, use_vllm=False, report_to="none", save_strategy="no", logging_steps=1,
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
        gradient_checkpointing=gradient_checkpointing,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward_fn, args=config, train_dataset=dataset,
                          processing_class=tokenizer)
    metrics_log = MetricsLogger(out_dir, config={"side": "trl", "model_dir": str(model_dir), "steps": steps,
                                                 "prompts_per_step": prompts_per_step,
                                                 "samples_per_prompt": samples_per_prompt, "lr": lr,
                                                 "max_new_tokens": max_new_tokens, "seed": seed})
    result: dict = {"steps": [], "evals": []}
    clock = {"train_s": 0.0, "eval_s": 0.0, "reached": None, "reached_wall": None, "t0": None}

    def do_eval(step: int) -> float:
        t = time.perf_counter()
        acc = evaluate(trainer.model, tokenizer, test_rows, max_new_tokens=max_new_tokens,
                       temperature=temperature, seed=seed + 1000 + step, bf16=bf16)
        dt = time.perf_counter() - t
        clock["eval_s"] += dt
        result["evals"].append({"step": step, "accuracy": acc, "train_time_s": clock["train_s"], "eval_s": dt})
        if clock["reached"] is None and acc >= target_acc:
            clock["reached"] = clock["train_s"]
            clock["reached_wall"] = time.perf_counter() - clock["t0"]
        log(f"[trl] step {step}: held-out accuracy {acc:.3f} (eval {dt:.1f}s)")
        return acc

    class Timing(TrainerCallback):
        def on_step_begin(self, args, st, control, **kw):
            state["step_begin"] = time.perf_counter()
            state["gen_end"] = None

        def on_step_end(self, args, st, control, **kw):
            now = time.perf_counter()
            step_s = now - state["step_begin"]
            gen_s = (state["gen_end"] or now) - state["step_begin"]
            clock["train_s"] += step_s
            rewards, tokens, comps = state["rewards"], state["tokens"], state["completions"]
            m = {"rollout/raw_reward": sum(rewards) / max(len(rewards), 1),
                 "rollout/response_len/mean": tokens / max(comps, 1),
                 "perf/rollout_time": gen_s, "perf/train_time": step_s - gen_s, "perf/step_time": step_s,
                 "perf/tokens_per_sec": tokens / step_s, "perf/completions_per_sec": comps / step_s,
                 "perf/rollout_tokens_per_sec": tokens / max(gen_s, 1e-9)}
            step = int(st.global_step)
            row = {"step": step, "completions": comps, "tokens": tokens, **m}
            state.update(tokens=0, completions=0, rewards=[])
            if eval_every and (step % eval_every == 0 or step == steps):
                m["eval/heldout"] = do_eval(step)
            result["steps"].append(row)
            metrics_log.log(m, step)
            log(f"[trl] step {step}/{steps}: reward {m['rollout/raw_reward']:.3f}, {step_s:.1f}s "
                f"(gen {gen_s:.1f}s), {m['perf/tokens_per_sec']:.0f} tok/s")

    trainer.add_callback(Timing())
    clock["t0"] = time.perf_counter()
    try:
        if eval_every:
            metrics_log.log({"eval/heldout": do_eval(0)}, 0)
        trainer.train()
    finally:
        metrics_log.close()
    wall = time.perf_counter() - clock["t0"]

    steps_rows = result["steps"]
    tot_tokens = sum(r["tokens"] for r in steps_rows)
    tot_comps = sum(r["completions"] for r in steps_rows)
    tot_step = sum(r["perf/step_time"] for r in steps_rows)
    tot_gen = sum(r["perf/rollout_time"] for r in steps_rows)
    result.update({
        "side": "trl", "trl_version": __import__("trl").__version__, "torch_threads": torch.get_num_threads(),
        "num_steps": len(steps_rows), "completions_per_step": completions_per_step,
        "step_time_mean_s": tot_step / max(len(steps_rows), 1),
        "completions_per_sec": tot_comps / max(tot_step, 1e-9),
        "tokens_per_sec": tot_tokens / max(tot_step, 1e-9),
        "rollout_tokens_per_sec": tot_tokens / max(tot_gen, 1e-9),
        "train_time_s": clock["train_s"], "eval_time_s": clock["eval_s"], "wall_time_s": wall,
        "time_split_s": {"rollout": tot_gen, "train": tot_step - tot_gen},
        "target_accuracy": target_acc, "time_to_target_s": clock["reached"],
        "time_to_target_wall_s": clock["reached_wall"],
        "initial_accuracy": result["evals"][0]["accuracy"] if result["evals"] else None,
        "final_accuracy": result["evals"][-1]["accuracy"] if result["evals"] else None,
        "peak_rss_mb": peak_rss_mb(),
        "config": {"steps": steps, "prompts_per_step": prompts_per_step, "samples_per_prompt": samples_per_prompt,
                   "max_new_tokens": max_new_tokens, "temperature": temperature, "lr": lr,
                   "eval_every": eval_every, "seed": seed, "micro_batch_size": micro_batch_size,
                   "loss_type": config.loss_type, "scale_rewards": config.scale_rewards, "beta": config.beta,
                   "max_grad_norm": config.max_grad_norm, "test_questions": len(test_rows),
                   "gradient_checkpointing": gradient_checkpointing},
    })
    (out_dir / "trl_result.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    return result


def print_table(res: dict) -> None:
    """A short human-readable summary of ``run_trl``'s result."""
    def fmt(v, spec=".2f"):
        return "-" if v is None else format(v, spec)

    rows = [("steps", res["num_steps"]), ("step time (s, mean)", fmt(res["step_time_mean_s"])),
            ("completions/s", fmt(res["completions_per_sec"])), ("tokens/s (step)", fmt(res["tokens_per_sec"], ".1f")),
            ("tokens/s (generation)", fmt(res["rollout_tokens_per_sec"], ".1f")),
            ("initial accuracy", fmt(res["initial_accuracy"], ".3f")), ("final accuracy", fmt(res["final_accuracy"], ".3f")),
            (f"train s to acc>={res['target_accuracy']}", fmt(res["time_to_target_s"], ".1f")),
            ("peak RSS (MiB)", fmt(res["peak_rss_mb"], ".0f"))]
    w = max(len(k) for k, _ in rows)
    print(f"\nTRL {res['trl_version']} GRPOTrainer (CPU, {res['torch_threads']} threads)")
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=None, help="HF model dir (default: prepared SmolLM2-135M-Instruct)")
    ap.add_argument("--data-dir", default=None, help="dir with train.jsonl/test.jsonl (default: written fresh)")
    ap.add_argument("--out-dir", default="runs/trl_side")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "trl_side.json"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts-per-step", type=int, default=8)
    ap.add_argument("--samples-per-prompt", type=int, default=8)
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--test-repeats", type=int, default=1, help="repeat each held-out question (less noisy eval)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default; off here")
    args = ap.parse_args(argv)

    from slick.demo.addition import write_addition_data
    from slick.models.smollm2 import prepare_smollm2

    model_dir = args.model_dir or prepare_smollm2()
    if args.data_dir:
        train, test = Path(args.data_dir) / "train.jsonl", Path(args.data_dir) / "test.jsonl"
    else:
        train, test = write_addition_data(Path(args.out_dir) / "data", test_repeats=args.test_repeats)
    res = run_trl(model_dir, train, test, steps=args.steps, prompts_per_step=args.prompts_per_step,
                  samples_per_prompt=args.samples_per_prompt, max_new_tokens=args.max_new_tokens,
                  temperature=args.temperature, lr=args.lr, eval_every=args.eval_every, seed=args.seed,
                  out_dir=args.out_dir, micro_batch_size=args.micro_batch_size, threads=args.threads,
                  gradient_checkpointing=args.gradient_checkpointing)
    print_table(res)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=2), encoding="utf-8")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
