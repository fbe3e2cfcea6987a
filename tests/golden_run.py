"""The golden run: a few fixed-seed steps of four runs whose results must not change when the code is restructured.

    python -m tests.golden_run --out FILE              # run all four, write one JSON
    python -m tests.golden_run --compare STORED NEW    # every difference by name; exit 1 if any counts

The four runs, each through ``slick.cli.main`` in this process with a tiny random model built here (seed 0):
``grpo`` (slick train, GRPO with a KL loss against the reference), ``ppo`` (slick train, PPO with the critic),
``agent`` (slick train whose rollout is a black-box agent session over the OpenAI API) and ``async``
(slick train-async, --max-staleness 0). Each records, per step, the deterministic metrics of metrics.jsonl
(no timings, throughput or memory), statistics of the advantages and rewards from --save-debug-train-data, a
sha256 of the trained token ids and loss masks; and a sha256 of the final policy weights (--save-hf) and, for
PPO, of the critic (its checkpoint). The algorithm and optimizer flags are given explicitly, so that a change of
a default (slime's defaults, issue 31) does not move the golden run: it checks the structure, not the defaults.

Bit-for-bit equality holds only on the same kind of CPU (AMX and AVX-512 kernels round differently): the JSON
records the CPU signature; :func:`compare` requires equal hashes only when the signatures are equal and compares
metrics to a relative tolerance of 1e-5 always (with an absolute floor of 1e-7, and of 1e-5 for the metrics in
``NOISE_FLOOR`` that are fp32 rounding noise by definition). Regenerate (docs/architecture.md, "The golden run") only from a
commit whose behaviour is the reference, never from the code under test.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
from pathlib import Path

SCENARIOS = ("grpo", "ppo", "agent", "async")
REL_TOL = 1e-5
ABS_TOL = 1e-7          # values that should be 0 (advantage means) differ by rounding noise across CPU kinds
# metrics that are rounding noise by definition (engine vs trainer logprobs in fp32, ~1e-7): an absolute floor
NOISE_FLOOR = {"train/train_rollout_logprob_abs_diff": 1e-5, "train/train_rollout_logprob_abs_diff_max": 1e-5}
# metrics that measure the machine, not the algorithm: timings, throughput, memory (reward/timeouts counts)
VOLATILE = re.compile(r"^perf/|^time$|(^|/|_)time($|/|_)|_per_sec|throughput|memory|(^|/|_)mem($|/|_)|rss|_mb$|in_flight")


# ------------------------------------------------------------------------------------------ plug-ins
def even_tokens(args, sample) -> float:
    """Reward: the share of response tokens with an even id (about 0.5 for a random model, varied)."""
    ids = sample.response_ids
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)


async def agent_even(args, sample, base_url) -> float:
    """A black-box agent: two chat calls that continue each other (a tool result between them); its reward is
    the share of even token ids in the two answers."""
    import openai

    ids: list[int] = []
    async with openai.AsyncOpenAI(base_url=base_url, api_key="slick", max_retries=0, timeout=120) as client:
        messages = [{"role": "user", "content": sample.prompt}]
        for _ in range(2):
            r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4,
                                                     extra_body={"return_token_ids": True})
            ids += r.choices[0].token_ids
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "tool", "content": "ok"}]
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)


# ------------------------------------------------------------------------------------------ the runs
# pinned values of every algorithm / optimizer / sampling flag the runs depend on (today's defaults)
PINNED = ["--lr", "1e-3", "--adam-beta1", "0.9", "--adam-beta2", "0.999", "--weight-decay", "0.0",
          "--clip-grad", "1.0", "--eps-clip", "0.2", "--entropy-coef", "0.0", "--kl-coef", "0.0",
          "--rollout-temperature", "1.0", "--rollout-top-p", "1.0", "--rollout-top-k", "-1",
          "--dtype", "fp32", "--seed", "3", "--rollout-seed", "5", "--no-progress", "--no-rollout-store",
          "--mismatch-probe-interval", "1", "--train-zero-advantage-samples"]


def scenario_argv(name: str, work: Path) -> list[str]:
    """The command line of one run; every output under ``work/name``."""
    out = work / name
    common = ["--hf-checkpoint", str(work / "model"), "--run-dir", str(out / "run"),
              "--save-debug-train-data", str(out / "dbg"), "--save-hf", str(out / "hf"), *PINNED]
    rm = ["--custom-rm-path", "tests.golden_run:even_tokens"]
    if name == "grpo":
        return ["train", *common, *rm, "--prompt-data", str(work / "prompts.jsonl"), "--advantage-estimator", "grpo",
                "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
                "--micro-batch-size", "4", "--num-rollout", "3", "--use-kl-loss", "--kl-loss-coef", "0.01",
                "--kl-loss-type", "low_var_kl"]
    if name == "ppo":
        return ["train", *common, *rm, "--prompt-data", str(work / "prompts.jsonl"), "--advantage-estimator", "ppo",
                "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6",
                "--micro-batch-size", "4", "--num-rollout", "3", "--critic-lr", "1e-3", "--value-clip", "0.2",
                "--gamma", "1.0", "--lambd", "1.0", "--save", str(out / "ckpt")]
    if name == "agent":   # one request at a time: the sessions' calls arrive by timing, and a batch's
        # composition moves the last bits of the engine's logprobs
        return ["train", *common, "--prompt-data", str(work / "agent_prompts.jsonl"), "--advantage-estimator",
                "grpo", "--agent-function-path", "tests.golden_run:agent_even", "--rollout-batch-size", "2",
                "--n-samples-per-prompt", "2", "--rollout-max-response-len", "16", "--micro-batch-size", "4",
                "--num-rollout", "2", "--engine-max-running", "1"]
    if name == "async":   # explicit thread counts: the trainer's share of cores then never depends on timing
        return ["train-async", *common, *rm, "--prompt-data", str(work / "prompts.jsonl"), "--advantage-estimator",
                "grpo", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
                "--micro-batch-size", "4", "--num-rollout", "3", "--max-staleness", "0",
                "--async-weight-update", "wait", "--train-num-threads", "1", "--rollout-num-threads", "1"]
    raise ValueError(f"unknown golden scenario {name!r} (choose from {', '.join(SCENARIOS)})")


def prepare(work: Path) -> None:
    """The tiny model (seed 0) and the prompt files."""
    from slick.models.tiny import make_tiny_model

    make_tiny_model(work / "model")
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(12)]
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (work / "agent_prompts.jsonl").write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(4)))


# ------------------------------------------------------------------------------------------ recording
def cpu_signature() -> dict:
    """What decides which CPU kernels run, and so the last bits of every float."""
    import torch

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_model": model,
            "processor": platform.processor(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__}


def tensors_sha256(files: list[Path], root: Path | None = None) -> str:
    """sha256 over the tensors of safetensors files: name, dtype, shape and bytes, in name order (the file's
    own header and layout do not count). With ``root``, each name is prefixed by its file's path under it."""
    import torch
    from safetensors.torch import load_file

    tensors = {}
    for f in files:
        prefix = f"{f.relative_to(root).as_posix()}:" if root else ""
        tensors.update({prefix + k: v for k, v in load_file(str(f)).items()})
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def volatile(key: str) -> bool:
    return bool(VOLATILE.search(key.lower()))


def _stats(xs: list[float], prefix: str) -> dict:
    if not xs:
        return {}
    return {f"{prefix}/mean": statistics.fmean(xs), f"{prefix}/std": statistics.pstdev(xs),
            f"{prefix}/min": min(xs), f"{prefix}/max": max(xs), f"{prefix}/count": len(xs)}


def step_record(metrics: dict, dump: list[dict]) -> dict:
    """One step: its deterministic metrics, advantage and reward statistics and the trained tokens' hash."""
    rec = {"metrics": {k: v for k, v in sorted(metrics.items()) if not volatile(k)}}
    adv = [a for r in dump for a, m in zip(r.get("advantages") or [], r["loss_mask"]) if m]
    derived = _stats(adv, "advantages")
    derived.update(_stats([float(r["reward"]) for r in dump], "rewards"))
    derived["tokens/response"] = sum(len(r["response_ids"]) for r in dump)
    derived["tokens/trained"] = sum(sum(r["loss_mask"]) for r in dump)
    rec["derived"] = derived
    tokens = [[r["index"], r["prompt_index"], r["response_ids"], r["loss_mask"]] for r in dump]
    rec["token_ids_sha256"] = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()
    return rec


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def record(name: str, work: Path) -> dict:
    out = work / name
    rows = _read_jsonl(out / "run" / "metrics.jsonl")
    steps = {}
    for row in rows:
        step = int(row["step"])
        dump_file = out / "dbg" / f"train_{step - 1}.jsonl"
        dump = _read_jsonl(dump_file) if dump_file.is_file() else []
        steps[str(step)] = step_record({k: v for k, v in row.items() if k != "step"}, dump)
    rec = {"steps": steps, "weights_sha256": tensors_sha256(sorted((out / "hf").glob("*.safetensors")))}
    critics = sorted((out / "ckpt").glob("*/critic")) if (out / "ckpt").is_dir() else []
    if critics:                                       # the last checkpoint's critic: backbone and value head
        rec["critic_weights_sha256"] = tensors_sha256(sorted(critics[-1].glob("**/*.safetensors")), critics[-1])
    return rec


def run_one(name: str, work: Path, threads: int) -> dict:
    import torch

    from slick.cli import main

    torch.set_num_threads(threads)    # each run starts as the first did (a run leaves the count as it set it)
    rc = main(scenario_argv(name, work))
    if rc != 0:
        raise RuntimeError(f"golden run {name!r}: slick exited with {rc}")
    return record(name, work)


def golden_run(work: Path, names=SCENARIOS) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    signature = cpu_signature()
    prepare(work)
    threads = signature["torch_threads"]
    return {"format": 1, "cpu_signature": signature, "runs": {n: run_one(n, work, threads) for n in names}}


# ------------------------------------------------------------------------------------------ comparing
def _close(a, b, path: str) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    floor = next((v for k, v in NOISE_FLOOR.items() if path.endswith("/" + k)), ABS_TOL)
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=floor)


def _walk(stored, current, path: str, diffs: list[str], hashes: list[str]) -> None:
    if isinstance(stored, dict) and isinstance(current, dict):
        for k in sorted(set(stored) | set(current), key=str):
            p = f"{path}/{k}" if path else str(k)
            if k not in current:
                diffs.append(f"{p}: missing now (stored {stored[k]!r})")
            elif k not in stored:
                diffs.append(f"{p}: not in the stored run (now {current[k]!r})")
            else:
                _walk(stored[k], current[k], p, diffs, hashes)
        return
    if path.endswith("sha256"):
        if stored != current:
            hashes.append(f"{path}: stored {stored} now {current}")
        return
    if not _close(stored, current, path):
        rel = ""
        if isinstance(stored, (int, float)) and isinstance(current, (int, float)) and stored:
            rel = f" (relative {abs(current - stored) / abs(stored):.2e})"
        diffs.append(f"{path}: stored {stored!r} now {current!r}{rel}")


def compare(stored: dict, current: dict) -> tuple[str, list[str], list[str]]:
    """(mode, differences that count, hash differences not required in this mode). ``mode`` is ``exact`` when
    the CPU signatures are equal (hashes must be equal too) and ``tolerance`` otherwise (metrics within a
    relative 1e-5; differing hashes are listed but do not count)."""
    mode = "exact" if stored.get("cpu_signature") == current.get("cpu_signature") else "tolerance"
    diffs: list[str] = []
    hashes: list[str] = []
    if stored.get("format") != current.get("format"):
        diffs.append(f"format: stored {stored.get('format')!r} now {current.get('format')!r}")
    _walk(stored.get("runs", {}), current.get("runs", {}), "", diffs, hashes)
    if mode == "exact":
        return mode, diffs + hashes, []
    return mode, diffs, hashes


def report(stored: dict, current: dict) -> tuple[bool, str]:
    mode, diffs, ignored = compare(stored, current)
    lines = [f"golden run compared in {mode} mode "
             + ("(same CPU signature: metrics within 1e-5 and equal weight/token hashes)" if mode == "exact" else
                f"(CPU signature differs: metrics within 1e-5, hashes not required)\n  stored: "
                f"{stored.get('cpu_signature')}\n  here:   {current.get('cpu_signature')}")]
    lines += [f"DIFF {d}" for d in diffs]
    lines += [f"hash differs (not required in {mode} mode): {d}" for d in ignored]
    lines.append(f"{len(diffs)} difference(s)")
    return not diffs, "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.golden_run", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the golden run's JSON here")
    p.add_argument("--work-dir", help="keep the runs' files here (default: a temporary directory)")
    p.add_argument("--only", default=",".join(SCENARIOS), help=f"comma-separated subset of {','.join(SCENARIOS)}")
    p.add_argument("--compare", nargs=2, metavar=("STORED", "NEW"), help="compare two golden-run JSON files")
    args = p.parse_args(argv)
    if args.compare:
        ok, text = report(*(json.loads(Path(f).read_text()) for f in args.compare))
        print(text)
        return 0 if ok else 1
    if not args.out:
        p.error("--out FILE or --compare STORED NEW is required")
    names = [n for n in args.only.split(",") if n]
    for n in names:
        if n not in SCENARIOS:
            p.error(f"--only: unknown scenario {n!r} (choose from {', '.join(SCENARIOS)})")
    if args.work_dir:
        result = golden_run(Path(args.work_dir), names)
    else:
        with tempfile.TemporaryDirectory(prefix="slick-golden-") as d:
            result = golden_run(Path(d), names)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"golden run: {', '.join(names)} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
