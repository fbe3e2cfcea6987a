"""Run an example README's bash block (tests/test_envs_*.py): each command once, the `slick train` one for one
step with the tiny model; `python` (also inside quoted flag values such as --mcp-server) is this venv's."""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ONE_STEP = ["--num-rollout", "1", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--micro-batch-size",
            "4", "--n-samples-per-eval-prompt", "1", "--eval-interval", "1", "--no-progress"]


def readme_commands(example: str) -> list[str]:
    text = (ROOT / "examples" / example / "README.md").read_text(encoding="utf-8")
    block = [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "slick train" in b][0]
    joined = block.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def run_readme(example: str, model_dir: Path, tmp_path: Path, replace: dict) -> list[dict]:
    """Run the commands with ``replace`` applied to each; returns the run's metrics rows."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for cmd in readme_commands(example):
        for old, new in {"MODEL_DIR": str(model_dir), **replace}.items():
            cmd = cmd.replace(old, new)
        argv = [a.replace("python ", f"{sys.executable} ") for a in shlex.split(cmd)]
        if argv[0] == "python":
            argv[0] = sys.executable
        elif argv[0] == "slick":
            run = argv.index("--run-dir")
            argv[run + 1] = str(tmp_path / "run")
            argv = [str(Path(sys.executable).parent / "slick")] + argv[1:] + ONE_STEP
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
