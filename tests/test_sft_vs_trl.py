"""One `slick sft` step equals one step of TRL's SFTTrainer on the same chats (assistant-only loss).

Both start from the same tiny random Llama on disk and train on the same three chats (one two-turn) in one
optimizer step: AdamW (betas 0.9/0.999, eps 1e-8, no weight decay), constant learning rate, no warm-up, gradient
norm clipped at 1.0, fp32. The chat template marks what the assistant says with ``{% generation %}`` so that
TRL's ``assistant_only_loss`` trains exactly the tokens slick trains (each assistant message's content and its
``<|im_end|>``; the newline after it and every user token are context), and slick's
``--calculate-per-token-loss`` is TRL's loss: the mean NLL over every trained token of the batch.
"""
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from slick.loop.sft import main as sft_main
from slick.models.tiny import make_tiny_model

pytestmark = pytest.mark.timeout(600)
LR = 1e-3
TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
            "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
            "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATS = [
    [{"role": "user", "content": "What is 3 + 4?"}, {"role": "assistant", "content": "<answer>7</answer>"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one?"},
     {"role": "assistant", "content": "Green, or maybe red."}],
    [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi there! How can I help you today?"}],
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = make_tiny_model(tmp_path_factory.mktemp("sft-vs-trl"), seed=11)
    tok = AutoTokenizer.from_pretrained(d)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(d)
    return d


def _trl_step(model_dir, out_dir):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(out_dir), per_device_train_batch_size=len(CHATS), gradient_accumulation_steps=1,
                     max_steps=1, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                     adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
                     optim="adamw_torch", assistant_only_loss=True, packing=False, use_cpu=True, bf16=False,
                     fp16=False, logging_steps=1, save_strategy="no", report_to=[], seed=0, shuffle_dataset=False,
                     dataloader_drop_last=False, average_tokens_across_devices=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = SFTTrainer(model=model, args=args, processing_class=AutoTokenizer.from_pretrained(model_dir),
                         train_dataset=Dataset.from_list([{"messages": c} for c in CHATS]))
    trained = sum(t != -100 for row in trainer.train_dataset["labels"] for t in row)   # TRL's assistant tokens
    trainer.train()
    loss = next(r["loss"] for r in trainer.state.log_history if "loss" in r)
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, loss, trained


def test_one_sft_step_equals_trl_sfttrainer(model_dir, tmp_path):
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in CHATS))
    assert sft_main(["--hf-checkpoint", str(model_dir), "--prompt-data", str(tmp_path / "chats.jsonl"),
                     "--rollout-batch-size", str(len(CHATS)), "--num-rollout", "1", "--lr", str(LR),
                     "--calculate-per-token-loss", "--clip-grad", "1.0", "--dtype", "fp32", "--seed", "0",
                     "--run-dir", str(tmp_path / "run"), "--save-hf", str(tmp_path / "hf"), "--no-progress",
                     "--no-rollout-store"]) == 0
    mine = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    theirs, trl_loss, trl_tokens = _trl_step(model_dir, tmp_path / "trl")
    # the same trained tokens: every assistant content token and its <|im_end|>, nothing else
    tok = AutoTokenizer.from_pretrained(model_dir)
    ends = sum(1 for c in CHATS for m in c if m["role"] == "assistant")
    content = sum(len(tok(m["content"], add_special_tokens=False)["input_ids"]) for c in CHATS for m in c
                  if m["role"] == "assistant")
    assert trl_tokens == content + ends == mine["rollout/sft_trained_tokens"]
    # the loss of the same forward: fp32 rounding only (a token more or less would move it by ~0.3)
    assert abs(mine["train/sft_loss"] - trl_loss) < 1e-4, (mine["train/sft_loss"], trl_loss)
    start = load_file(str(next(model_dir.glob("*.safetensors"))))
    after = load_file(str(next((tmp_path / "hf").glob("*.safetensors"))))
    moved = diff = 0.0
    err = norm = 0.0
    for name, w0 in start.items():
        d_mine, d_trl = after[name].float() - w0.float(), theirs[name].float() - w0.float()
        moved = max(moved, float(d_trl.abs().max()))
        diff = max(diff, float((d_mine - d_trl).abs().max()))
        err += float(((d_mine - d_trl) ** 2).sum())
        norm += float((d_trl ** 2).sum())
    rel = (err / norm) ** 0.5
    print(f"loss {mine['train/sft_loss']:.7f} vs TRL {trl_loss:.7f}; update: max |mine - TRL| {diff:.3g} "
          f"(LR {LR}), relative L2 {rel:.3g}")
    # Adam's first step moves each weight by LR * g / (|g| + eps): about LR wherever |g| >> eps. Where a gradient
    # is within a few eps of 0, its fp32 rounding shows in the step (measured: at most 2.1e-6 = 2e-3 LR for one
    # weight, 2.5e-6 relative over the whole update), so the bounds are 1e-2 LR and 2e-5
    assert moved > 0.5 * LR and diff < 1e-2 * LR and rel < 2e-5, (moved, diff, rel)
