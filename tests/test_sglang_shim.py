"""slick/engines/sglang_shim: the two sgl_kernel CPU functions against plain-loop references, the torchvision
stand-in's behaviour, and that neither is importable under its own name in slick's environment."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from slick.engines.sglang_shim import PATH
from slick.engines.sglang_shim.sgl_kernel import assign_req_to_token_pool_cpu, copy_all_layer_kv_cache_cpu


def _assign_reference(req_pool_indices, req_to_token, start, end, out_cache_loc):
    """The Triton kernel's semantics, one element at a time."""
    out = req_to_token.clone()
    offset = 0
    for i in range(len(req_pool_indices)):
        row = int(req_pool_indices[i])
        for j in range(int(start[i]), int(end[i])):
            out[row, j] = out_cache_loc[offset]
            offset += 1
    return out


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_assign_req_to_token_pool_equals_the_reference(dtype):
    g = torch.Generator().manual_seed(0)
    req_to_token = torch.randint(0, 1000, (6, 40), generator=g, dtype=dtype)
    req_pool_indices = torch.tensor([4, 0, 2, 5])
    start = torch.tensor([0, 7, 13, 39])
    end = torch.tensor([5, 7, 30, 40])        # one empty run, one of length 1 at the row's end
    total = int((end - start).sum())
    out_cache_loc = torch.arange(5000, 5000 + total + 3, dtype=torch.int64)   # longer than needed: the rest unused
    want = _assign_reference(req_pool_indices, req_to_token, start, end, out_cache_loc)
    got = req_to_token.clone()
    assign_req_to_token_pool_cpu(req_pool_indices, got, start, end, out_cache_loc, got.shape[1])
    assert torch.equal(got, want)
    assert not torch.equal(got, req_to_token)     # it wrote in place
    assert got.dtype == dtype
    with pytest.raises(ValueError, match="pool_len 41"):
        assign_req_to_token_pool_cpu(req_pool_indices, got, start, end, out_cache_loc, 41)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_copy_all_layer_kv_cache_equals_the_reference_with_overlapping_rows(dtype):
    g = torch.Generator().manual_seed(1)
    # K and V buffers of 3 layers, rows of (heads, head_dim) like SGLang's MHA pool; V rows have another width
    bufs = [torch.randn(20, 2, 8, generator=g).to(dtype) for _ in range(3)] + \
           [torch.randn(20, 1, 4, generator=g).to(dtype) for _ in range(3)]
    before = [b.clone() for b in bufs]
    data_ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    src = torch.tensor([3, 4, 5, 0])
    tgt = torch.tensor([4, 5, 6, 19])         # 4 and 5 are both read and written: the old rows must move
    copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for b, old in zip(bufs, before):
        want = old.clone()
        for s, t in zip(src.tolist(), tgt.tolist()):
            want[t] = old[s]
        assert torch.equal(b, want)
    assert torch.equal(bufs[0][6], before[0][5]) and not torch.equal(bufs[0][6], before[0][6])


def test_copy_all_layer_kv_cache_checks_lengths_and_takes_no_rows():
    b = torch.zeros(4, 3)
    ptrs, strides = torch.tensor([b.data_ptr()], dtype=torch.uint64), torch.tensor([12])
    copy_all_layer_kv_cache_cpu(ptrs, strides, torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    with pytest.raises(ValueError, match="2 source rows but 1 target"):
        copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([1]), torch.tensor([0, 1]))


def test_the_shim_is_not_importable_by_its_own_names_in_slick():
    assert importlib.util.find_spec("sgl_kernel") is None
    assert PATH not in sys.path


def test_torchvision_stand_in_imports_what_sglang_needs_and_refuses_the_rest():
    code = (
        "import torchvision\n"
        "from torchvision.transforms import InterpolationMode, functional as TF\n"
        "from torchvision.io import ImageReadMode, decode_image\n"
        "from torchvision.transforms.v2 import functional as F2\n"
        "assert InterpolationMode.BICUBIC.value == 'bicubic'\n"
        "try:\n"
        "    TF.resize(None, [2, 2])\n"
        "except ImportError as e:\n"
        "    print('refused:', e)\n")
    env = dict(os.environ, PYTHONPATH=PATH)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused: torchvision.transforms.functional.resize: torchvision is a stand-in"), \
        out.stdout
