"""SFT: chat tokens and masks for three templates, the loss against a hand-computed cross-entropy, bad rows named
by file and line, slime's spellings, the LR schedule."""
import json
import math

import pytest
import torch

from slick.algo.inputs import LossInputs
from slick.algo.params import AlgoParams
from slick.algo.sft import sft_eval_metrics, sft_loss, sft_objective
from slick.chat.delta import encode
from slick.chat.turns import chat_tokens, tool_call_text
from slick.config import Config, ConfigError
from slick.configure import build_parser, parse_config
from slick.configure.validate import validate_config
from slick.data.chats import ChatDataset
from slick.data.dataset import DataError
from slick.models.tokenizer import load_tokenizer
from slick.train.lr import lr_factor_fn
from tests.chat_templates import COUNTING, LLAMA3_STYLE, QWEN_STYLE, tokenizer_with
from tests.batches import batch_of

CALL = {"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
CHAT = [{"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "5"},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "<answer>5</answer>"}]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.mark.parametrize("template", ["smollm2", "llama3", "qwen"])
def test_only_assistant_tokens_are_trained(tok, template):
    t = tok if template == "smollm2" else tokenizer_with(LLAMA3_STYLE if template == "llama3" else QWEN_STYLE)
    out = chat_tokens(t, CHAT)
    stop = t.eos_token_id
    trained, runs, cur = [], [], []
    for i, m in zip(out.response_ids, out.loss_mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    # exactly two trained runs: each assistant message's text (the tool call as hermes text) and its stop token
    call = tool_call_text([CALL])
    want_call = call if template != "llama3" else call.strip()
    assert runs == [encode(t, want_call) + [stop], encode(t, "<answer>5</answer>") + [stop]]
    assert len(out.loss_mask) == len(out.response_ids)
    # prompt + response is the template's text of the whole chat (up to the last assistant's closing)
    full = t.decode(out.prompt_ids + out.response_ids, skip_special_tokens=False)
    rendered = t.apply_chat_template([dict(m) if "tool_calls" not in m else
                                      {"role": "assistant", "content": call} for m in CHAT], tokenize=False)
    assert rendered.startswith(full) and len(rendered) - len(full) <= 1
    # the tool result and the user turn are not trained
    assert "5" in t.decode([i for i, m in zip(out.response_ids, out.loss_mask) if not m])


def test_a_template_that_rewrites_history_is_refused_naming_the_row(tok, tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n")
    with pytest.raises(DataError, match=r"chats.jsonl:1: chat template rewrites earlier turns"):
        ChatDataset(str(path), tokenizer_with(COUNTING))


@pytest.mark.parametrize("row, words", [
    ({"text": "hi"}, "missing input key 'messages'"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "prompt before it is empty"),
    ({"messages": "hello"}, "must be a list of chat messages"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
                                                      "tool_calls": [{"function": {"name": "f",
                                                                                   "arguments": "{bad"}}]}]},
     "arguments are not valid JSON"),
    ({"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]}, "message 0 \\(user\\) has no content"),
])
def test_a_bad_row_names_file_line_and_problem(tok, tmp_path, row, words):
    path = tmp_path / "chats.jsonl"
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"chats.jsonl:3: .*{words}"):
        ChatDataset(str(path), tok)


def test_prompt_completion_pairs_and_too_long_chats(tok, tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "2+3=", "completion": " 5"}) + "\n")
    row = ChatDataset(str(path), tok, input_key="prompt")[0]
    assert row["prompt_ids"] == encode(tok, "2+3=")
    assert row["response_ids"] == encode(tok, " 5") + [tok.eos_token_id] and all(row["loss_mask"])
    chat = ChatDataset(str(path), tok, input_key="prompt", apply_chat_template=True)[0]
    assert chat["prompt_ids"] == encode(tok, tok.apply_chat_template([{"role": "user", "content": "2+3="}],
                                                                     tokenize=False, add_generation_prompt=True))
    with pytest.raises(DataError, match=r"pairs.jsonl:1: the chat is \d+ tokens long, more than the 3"):
        ChatDataset(str(path), tok, input_key="prompt", max_len=3)


def test_sft_loss_is_the_masked_nll_per_sample_or_per_token():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    # per sample: mean of (1 + 3) / 2 = 2 and (0.5 + 4) / 2 = 2.25 -> 2.125
    assert float(sft_loss(lp, mask, per_token=False)) == pytest.approx(2.125)
    # per token: (1 + 3 + 0.5 + 4) / 4
    assert float(sft_loss(lp, mask, per_token=True)) == pytest.approx(8.5 / 4)
    # micro-batches with the global normalisers sum to the global loss
    parts = [sft_loss(lp[i:i + 1], mask[i:i + 1], True, num_tokens=4) for i in range(2)]
    assert float(sum(parts)) == pytest.approx(8.5 / 4)
    m = sft_eval_metrics([lp[0], lp[1]], [torch.tensor([True, False, False]), torch.tensor([True, True, True])],
                         [[1, 0, 1], [1, 1, 0]])
    assert m["loss"] == pytest.approx(8.5 / 4) and m["token_acc"] == pytest.approx(3 / 4) and m["tokens"] == 4


def _cfg(model, data, **over):
    values = dict(hf_checkpoint=str(model), prompt_data=str(data), loss_type="sft_loss", n_samples_per_prompt=1,
                  input_key="messages", rollout_batch_size=2, lr=1e-3, dtype="fp32", micro_batch_size=1,
                  offload_rollout=False)
    values.update(over)
    return validate_config(Config.from_flat(values))


@pytest.mark.parametrize("per_token", [False, True])
def test_one_trainer_step_equals_hand_computed_cross_entropy(tiny_model_dir, tok, per_token):
    """The trainer's SFT loss over two chats (packed, micro-batches of one) equals the token cross-entropy of an
    HF forward over exactly the assistant tokens, and so do the gradients of one weight."""
    from transformers import AutoModelForCausalLM

    from slick.train.trainer import Trainer
    from slick.types import Sample

    cfg = _cfg(tiny_model_dir, tiny_model_dir / "config.json", calculate_per_token_loss=per_token)
    chats = [chat_tokens(tok, CHAT), chat_tokens(tokenizer_with(QWEN_STYLE), CHAT[1:4] + CHAT[5:])]
    samples = [Sample(index=i, prompt_ids=c.prompt_ids, response_ids=c.response_ids, loss_mask=c.loss_mask)
               for i, c in enumerate(chats)]
    trainer = Trainer(cfg)
    loss_fn = lambda inputs: sft_objective(AlgoParams.from_config(cfg), inputs)  # noqa: E731
    out = trainer.forward_backward(batch_of(samples, [torch.zeros(len(s.response_ids)) for s in samples]), loss_fn)
    grad = dict(zip(trainer.param_names, trainer.master))["model.layers.0.mlp.up_proj.weight"].grad.clone()

    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    nll, counts = [], []
    for s in samples:
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logp = torch.log_softmax(ref(input_ids=ids).logits[0].float(), -1)
        p = len(s.prompt_ids)
        tok_lp = logp[p - 1:-1].gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0]
        m = torch.tensor(s.loss_mask, dtype=torch.float32)
        nll.append(-(tok_lp * m).sum())
        counts.append(m.sum())
    want = sum(nll) / sum(counts) if per_token else sum(n / c for n, c in zip(nll, counts)) / 2
    want.backward()
    assert out["loss"] == pytest.approx(float(want), rel=1e-5)
    ref_grad = dict(ref.named_parameters())["model.layers.0.mlp.up_proj.weight"].grad
    assert torch.allclose(grad, ref_grad, atol=1e-6, rtol=1e-4)


def test_slime_spelling_parses_and_sft_refusals_name_the_flag(tiny_model_dir, tmp_path):
    data = tmp_path / "c.jsonl"
    data.write_text("{}\n")
    argv = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(data), "--input-key", "messages",
            "--loss-type", "sft_loss", "--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout",
            "--calculate-per-token-loss", "--disable-compute-advantages-and-returns", "--debug-train-only",
            "--rollout-batch-size", "4"]     # slime's SFT scripts leave --n-samples-per-prompt at slime's 1
    cfg = parse_config(argv, build_parser())
    assert cfg.loss_type == "sft_loss" and cfg.calculate_per_token_loss and cfg.global_batch_size == 4
    assert cfg.n_samples_per_prompt == 1 and cfg.offload_rollout is False
    with pytest.raises(ConfigError, match="--n-samples-per-prompt must be 1"):
        parse_config(argv + ["--n-samples-per-prompt", "4"], build_parser())
    with pytest.raises(ConfigError, match="--use-kl-loss does not apply"):
        parse_config(argv + ["--use-kl-loss"], build_parser())
    with pytest.raises(ConfigError, match="is the SFT rollout: it needs --loss-type sft_loss"):
        parse_config(argv + ["--loss-type", "policy_loss", "--n-samples-per-prompt", "2"], build_parser())
    with pytest.raises(ConfigError, match="--lr-decay-style cosine needs --lr-decay-iters"):
        parse_config(argv + ["--lr-decay-style", "cosine"], build_parser())


def test_lr_schedule():
    f = lr_factor_fn(1.0, warmup=2, style="linear", decay_iters=6, min_lr=0.2)
    assert [round(f(s), 6) for s in range(8)] == [0.5, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2]
    c = lr_factor_fn(2.0, warmup=0, style="cosine", decay_iters=4, min_lr=0.0)
    assert [round(c(s), 6) for s in range(5)] == [1.0, round(0.5 * (1 + math.cos(math.pi / 4)), 6), 0.5,
                                                 round(0.5 * (1 + math.cos(3 * math.pi / 4)), 6), 0.0]
    assert [lr_factor_fn(1.0, warmup=4)(s) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
