"""slime-style launch scripts with the flag sets of slime's examples (tests/slime_launch_scripts.py) run on slick:
`slick slime-check` names the command and what it refuses, and the command runs two steps of each on the tiny
model with only paths, sizes and the hardware (one CPU, no GPUs) changed."""
import json
import math
import threading

import psutil
import pytest

from slick import cli
from slick.configure.slime_check import check, split_flags, to_slick
from tests.slime_launch_scripts import SCRIPTS

SIZES = {"--num-rollout": "2", "--num-epoch": None, "--rollout-batch-size": "2", "--n-samples-per-prompt": "2",
         "--global-batch-size": "4", "--rollout-max-response-len": "8", "--eval-max-response-len": "8",
         "--n-samples-per-eval-prompt": "1", "--max-tokens-per-gpu": "1024", "--actor-num-gpus-per-node": "0",
         "--rollout-num-gpus": None}
# flags slime-check refuses in a script, which its user drops (W&B needs an account too)
DROPPED = {"multi-turn": {"--wandb-key", "--use-wandb", "--wandb-project", "--wandb-group"}}


def resized(name, argv):
    out = []
    for flag, values in split_flags(argv):
        if flag in DROPPED.get(name, ()) or (flag in SIZES and SIZES[flag] is None):
            continue
        out += [flag] + ([SIZES[flag]] if flag in SIZES else values)
    if name == "sft":     # the number of steps in place of the epochs (slime takes --num-rollout too)
        out += ["--num-rollout", "2", "--global-batch-size", "2"]
    return out


def listeners():
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


def threads():
    return {t for t in threading.enumerate() if t.is_alive() and not t.daemon}


@pytest.mark.slow
def test_slime_scripts_run_two_steps(tiny_model_dir, tmp_path):
    """... and leave no listening socket or thread behind (the multi-turn script's slime generate function is
    served a /generate front, which its run closes)."""
    before_listeners, before_threads = listeners(), threads()
    data, chats = tmp_path / "train.jsonl", tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 2?", "label": str(i + 2)}) + "\n" for i in range(4)))
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Say {i}."},
                                                      {"role": "assistant", "content": f"{i}."}]}) + "\n"
                             for i in range(4)))
    commands = {}
    for name, text in SCRIPTS.items():
        paths = {"{MODEL}": str(tiny_model_dir), "{DATA}": str(data), "{CHATS}": str(chats),
                 "{SAVE}": str(tmp_path / name / "ckpt"), "{PLUGIN}": "tests.slime_hook_plugins",
                 "{MODEL_ARGS}": "unused.sh"}
        for k, v in paths.items():
            text = text.replace(k, v)
        lines, _ = check(text)
        refused = [line.split()[1].rstrip(":") for line in lines[1:] if line.startswith("refused")]
        assert refused == (["--wandb-key"] if name == "multi-turn" else []), name
        command, argv = to_slick(text)
        commands[name] = command
        run = tmp_path / name / "run"
        rc = cli.main([command.split()[1], *resized(name, argv), "--run-dir", str(run), "--no-progress",
                       "--dtype", "fp32"])
        assert rc == 0, name
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        trained = [m for m in rows if "train/grad_norm" in m]
        assert [m["step"] for m in trained] == [1, 2], name
        assert all(math.isfinite(m["train/grad_norm"]) for m in trained), name
        if name == "sft":     # a random tiny model earns no reward, but the chats' NLL always has a gradient
            assert all(m["train/grad_norm"] > 0 for m in trained)
    assert listeners() - before_listeners == set() and threads() - before_threads == set()
    assert commands == {"grpo": "slick train", "sft": "slick train", "multi-turn": "slick train",
                        "async": "slick train-async"}
