"""What a LoRA trainer holds (slick/train/lora.py): optimizer state the size of the adapters, the frozen base in
the compute dtype with no gradients, fp32 adapters, and MLPs that recompute in backward (fewer saved activations,
the same gradients)."""
import torch

from slick.train.lora import recompute_mlps
from slick.train.trainer import Trainer
from tests.batches import batch_of
from tests.test_lora import advantages, lora_cfg, nudge_b
from tests.test_train import make_cfg, make_samples, simple_loss


def moment_bytes(opt) -> int:
    return sum(t.numel() * t.element_size() for st in opt.state.values() for k, t in st.items() if k != "step")


def test_optimizer_state_is_adapter_sized_and_the_base_is_frozen(tiny_model_dir):
    samples = make_samples(4)
    for dtype, base_dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        tr = Trainer(lora_cfg(tiny_model_dir, dtype=dtype))
        tr.train_step(batch_of(samples, advantages(samples)), simple_loss)
        adapter = sum(p.numel() for p in tr.params)
        total = sum(p.numel() for p in tr.model.parameters())
        # rank 4 on every linear layer (in + out features): q, o 64+64; k, v 64+32; gate, up, down 64+128; 2 layers
        assert adapter == 2 * 4 * (2 * 128 + 2 * 96 + 3 * 192) == 8192 and total > 50 * adapter
        assert {id(p) for p in tr.optimizer.state} == {id(p) for p in tr.params}
        assert moment_bytes(tr.optimizer) == 2 * adapter * 4   # AdamW: exp_avg + exp_avg_sq, fp32, adapters only
        assert all(p.dtype == torch.float32 and ".lora_" in n for n, p in zip(tr.param_names, tr.params))
        frozen = [p for p in tr.model.parameters() if not p.requires_grad]
        assert frozen and all(p.dtype == base_dtype and p.grad is None for p in frozen)
        assert tr.lora.frozen_bytes() == (total - adapter) * base_dtype.itemsize
        assert tr.lora.recomputed_mlps == 2


def saved_bytes(model, ids) -> tuple[int, torch.Tensor]:
    """Bytes autograd saves for backward in one forward of ``model`` on ``ids``, and the summed logits."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids).logits.float().sum()
    return total, out


def test_mlp_recomputation_keeps_less_and_changes_no_gradient(tiny_model_dir):
    samples = make_samples(2)
    ids = torch.tensor([samples[0].prompt_ids + samples[0].response_ids])
    grads, saved = [], []
    for wrap in (False, True):
        torch.manual_seed(0)   # the same lora_A initialisation
        tr = Trainer(make_cfg(tiny_model_dir, lora_rank=4, lr=1e-2))
        if not wrap:   # undo the wrapping: the HF MLP forward as PEFT left it
            for layer in tr.model.base_model.layers:
                del layer.mlp.forward
        nudge_b(tr)
        n, loss = saved_bytes(tr.model, ids)
        loss.backward()
        grads.append([p.grad.clone() for p in tr.params])
        saved.append(n)
    assert all(torch.equal(a, b) for a, b in zip(*grads))   # the same numbers
    inter, width = 128, ids.shape[1]
    # per layer the MLP's gate, up, SiLU and product outputs (fp32) stay out; its input is kept once
    assert saved[0] - saved[1] >= 2 * 3 * inter * width * 4, saved
    assert recompute_mlps(tr.model) == 0   # already wrapped: not twice
