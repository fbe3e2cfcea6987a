"""slick.train.protocol.Trainer: every trainer implementation satisfies it, the in-process trainer sends weights
through the same call as the Ray group, and the loop never asks which trainer it has."""
import ast
import asyncio
import inspect
from pathlib import Path

import torch

from slick.cluster.critic_group import RayCriticGroup
from slick.cluster.trainer_group import RayTrainerGroup
from slick.config import Config
from slick.engine.local import LocalEngine
from slick.factory.engines import EngineSet
from slick.loop.run import Run
from slick.loop.weights import EngineWeights
from slick.train.critic import Critic
from slick.train.protocol import Trainer as TrainerProtocol
from slick.train.protocol import WeightSink
from slick.train.trainer import Trainer
from slick.types import Sample, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [1, 20, 30, 40]
TRAINER_CLASSES = ("Trainer", "Critic", "RayTrainerGroup", "RayCriticGroup", "CheckpointPair")


def cfg_for(model_dir, **over):
    values = dict(hf_checkpoint=str(model_dir), dtype="fp32", lr=1e-2, micro_batch_size=4, seed=3,
                  rollout_max_response_len=8)
    values.update(over)
    return Config.from_flat(values)


def protocol_members(proto) -> set:
    return {n for n in list(vars(proto)) + list(getattr(proto, "__annotations__", {}))
            if not n.startswith("_")}


def test_the_protocol_names_what_the_loop_calls():
    assert protocol_members(TrainerProtocol) == {
        "version", "skipped_steps", "has_ref", "device", "dtype", "train_step", "compute_logprobs",
        "candidate_logprobs", "named_weights", "send_weights", "save", "load", "save_hf_files", "close", "work"}
    assert inspect.iscoroutinefunction(TrainerProtocol.send_weights)


def test_in_process_trainer_and_critic_are_trainers(tiny_model_dir):
    trainer = Trainer(cfg_for(tiny_model_dir))
    critic = Critic(cfg_for(tiny_model_dir, advantage_estimator="ppo"))
    assert isinstance(trainer, TrainerProtocol) and isinstance(critic, TrainerProtocol)
    assert trainer.thread_budget is None     # given to the constructor; none unless a driver passes one
    budget = Trainer(cfg_for(tiny_model_dir), thread_budget=lambda: 1).thread_budget
    assert budget() == 1


def test_ray_trainer_group_is_a_trainer_and_its_critic_group_is_not():
    # every member is defined by the class itself (the properties read the ranks' last state)
    for name in protocol_members(TrainerProtocol):
        assert hasattr(RayTrainerGroup, name), name
    assert inspect.iscoroutinefunction(RayTrainerGroup.send_weights)
    group = RayTrainerGroup.__new__(RayTrainerGroup)   # no ranks started: the interface only
    group._state = {"version": 4, "skipped_steps": 0, "has_ref": False, "device": "cpu", "dtype": "torch.float32"}
    assert isinstance(group, TrainerProtocol) and group.version == 4
    critics = RayCriticGroup.__new__(RayCriticGroup)   # a value model: no weights for the engines
    assert not isinstance(critics, TrainerProtocol)


def test_in_process_trainer_sends_its_weights_through_the_sink(tiny_model_dir, tmp_path):
    """The in-process trainer's send_weights (moved out of Run.sync_weights): the colocated transport hands the
    trained weights to the in-process engine, at the trainer's version; before, the engine differs."""
    cfg = cfg_for(tiny_model_dir, weight_transport="auto")
    trainer = Trainer(cfg)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    trainer.version = 2
    engine = LocalEngine(str(tiny_model_dir), dtype="fp32", device="cpu", max_running=2, seed=0)
    sink = EngineWeights(cfg, EngineSet(engine, "tensors"), None, tmp_path)
    assert isinstance(sink, WeightSink)
    assert (sink.transport, sink.ranks_reach_engines, sink.disk_dir) == ("colocated", False,
                                                                          str(tmp_path / "weights"))

    def gap(gen):   # engine logprobs vs the trainer's, same tokens
        want = trainer.compute_logprobs([Sample(prompt_ids=PROMPT, response_ids=gen.token_ids)])[0]
        return float((torch.tensor(gen.logprobs) - want).abs().max())

    async def go():
        probe = SamplingParams(temperature=1.0, max_new_tokens=6, seed=3)
        try:
            before = await engine.generate(PROMPT, probe)
            seconds = await trainer.send_weights(sink)
            after = await engine.generate(PROMPT, probe)
            return before, seconds, after, await engine.get_weight_version()
        finally:
            await sink.close()
            await engine.close()

    before, seconds, after, version = asyncio.run(go())
    assert version == 2 and seconds > 0
    assert gap(before) > 1e-2 and gap(after) < 1e-4


def _trainer_type_checks(source: str, name: str) -> list:
    """isinstance / hasattr / getattr calls in ``source`` that look at a trainer or critic (by the object's name or
    by a trainer class or member name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "hasattr", "getattr")):
            continue
        text = " ".join(ast.unparse(a) for a in node.args[:2])
        if any(w in text for w in ("trainer", "critic", *TRAINER_CLASSES, "remote", "send_weights")):
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_loop_never_asks_which_trainer_it_has():
    loop = sorted((ROOT / "slick" / "loop").glob("*.py"))
    assert len(loop) >= 8
    assert [f for p in loop for f in _trainer_type_checks(p.read_text(), p.name)] == []
    # the check finds the checks the loop used to make
    old = ("def f(self):\n    if hasattr(self.critic, 'close'):\n        pass\n"
           "    if getattr(trainer, 'remote', False):\n        pass\n    isinstance(x, RayTrainerGroup)\n")
    assert len(_trainer_type_checks(old, "old.py")) == 3
    # sync_weights has one path for every trainer: no branch on Ray, the engines' sync mode or the transport
    fn = ast.parse(inspect.getsource(Run.sync_weights).strip()).body[0]
    src = "\n".join(ast.unparse(stmt) for stmt in fn.body[1:])   # the code, without the docstring
    assert "send_weights(self.train_parts.weights)" in src
    assert not any(w in src for w in ("ray", "sync_mode", "transport", "isinstance", "hasattr"))
