"""LoRA with the other rollouts: multi-turn tool calls and black-box agent sessions train a LoRA policy, every
weight sync (the adapter alone, merged on arrival by the in-process engine) passes the check."""
import asyncio
import json

from slick.config import Config
from slick.configure.validate import validate_config
from slick.loop.sync import train
from tests.test_agent import agents_module, make_cfg as agent_cfg  # noqa: F401  (agents_module: a fixture)


def _steps(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _checked(rows):
    """Every step's weight check ran and passed its fp32 bound (1e-3: trainer and engine agree to ~1e-5)."""
    diffs = [r["perf/weight_check_max_abs_diff"] for r in rows]
    assert len(diffs) == len(rows) == 2 and max(diffs) <= 1e-3, diffs


def test_lora_with_multi_turn_tool_calls(tiny_model_dir, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"What is {i} + 30?"}],
                                        "label": None}) + "\n" for i in range(4)))
    values = dict(hf_checkpoint=str(tiny_model_dir), dtype="fp32", prompt_data=str(data), apply_chat_template=True,
                  rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=2, rollout_max_response_len=300,
                  max_turns=2, max_tokens_per_turn=6, tool_path="tests.agent_tools:GOOD",
                  tool_parser="tests.test_multiturn:two_calls", custom_rm_path="tests.golden_run.even_tokens",
                  lora_rank=4, lr=1e-2, micro_batch_size=4, run_dir=str(tmp_path / "run"), no_progress=True)
    run = asyncio.run(asyncio.wait_for(train(validate_config(Config.from_flat(values))), 300))
    rows = _steps(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and run.train_parts.trainer.version == 2
    assert all(r["rollout/turns/mean"] == 2.0 and r["rollout/tool_calls/mean"] == 2.0 for r in rows)
    _checked(rows)


def test_lora_with_agent_sessions(tiny_model_dir, agents_module, tmp_path):  # noqa: F811
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"question {i}", "label": str(i)}) + "\n" for i in range(4)))
    cfg = agent_cfg(tiny_model_dir, "even_reward", prompt_data=str(data), rollout_batch_size=2, n_samples_per_prompt=2,
                    num_rollout=2, lr=1e-2, run_dir=str(tmp_path / "run"), no_progress=True, micro_batch_size=4,
                    custom_rm_path=None, lora_rank=4)
    run = asyncio.run(asyncio.wait_for(train(cfg), 300))
    rows = _steps(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and run.train_parts.trainer.version == 2
    assert all(r["rollout/agent_calls/mean"] == 2.0 and r["rollout/agent_errors"] == 0.0 for r in rows)
    _checked(rows)
