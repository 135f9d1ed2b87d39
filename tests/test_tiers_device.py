"""KV tensors outside host memory: a GPU's KV cache stored and restored through the tiers.

The CUDA tests need a device (skipped here without one); the host-side checks run everywhere.
"""

import pytest
import torch

from kvcore.errors import InvalidArgumentError
from kvcore.tiers import Namespace, TierManager
from tiers_support import load_kv

NS = Namespace("minilm-l6", "bfloat16", salt="device-tests")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def kv():
    return load_kv()[:, :, :512].contiguous()  # [6, 2, 512, 12, 32] bf16


def same(a, b):
    return torch.equal(a.cpu().view(torch.int16), b.cpu().view(torch.int16))


def test_meta_tensors_are_refused(kv):
    with TierManager(ddr_bytes=16 << 20, namespace=NS) as tm:
        with pytest.raises(InvalidArgumentError, match="meta"):
            tm.store(list(range(512)), kv.to("meta"))
        with pytest.raises(InvalidArgumentError, match="meta"):
            tm.retrieve(list(range(512)), torch.empty(kv.shape, dtype=kv.dtype, device="meta"))


def test_strided_host_out_goes_through_staging(kv):
    """An out whose chunk slices are not contiguous (tokens not the third dimension in
    memory) is filled through the staging path that device outputs use too."""
    toks = list(range(512))
    with TierManager(ddr_bytes=16 << 20, namespace=NS) as tm:
        tm.store(toks, kv)
        assert tm.flush(30)
        backing = torch.zeros(kv.shape[0], kv.shape[1], kv.shape[3], kv.shape[2], kv.shape[4], dtype=kv.dtype)
        out = backing.transpose(2, 3)  # [layers, 2, tokens, heads, dim], token stride != heads*dim
        assert not out[:, :, :256].is_contiguous()
        layers = []
        assert tm.retrieve(toks, out, on_layer=layers.append) == 512
        assert same(out, kv) and layers == list(range(kv.shape[0]))


@cuda
@pytest.mark.parametrize("tier", ["ddr", "ssd"])
def test_gpu_kv_round_trip(kv, tmp_path, tier):
    toks = list(range(512))
    dev = kv.cuda()
    cfg = dict(ddr_bytes=64 << 20) if tier == "ddr" else dict(ddr_bytes=0, ssd_dir=str(tmp_path), ssd_bytes=1 << 30)
    with TierManager(namespace=NS, **cfg) as tm:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):  # the KV is produced on a non-default stream
            produced = dev * 1
            assert tm.store(toks, produced) == 2
        dev_bits = dev
        produced.zero_()  # store() copied it already: later writes to the cache do not matter
        assert tm.flush(30) and tm.lookup(toks).tiers == [tier, tier]
        out = torch.zeros_like(dev)
        layers = []

        def on_layer(l):  # layer l is on the device when its call comes
            assert same(out[l], dev_bits[l])
            layers.append(l)

        assert tm.retrieve(toks, out, on_layer=on_layer) == 512
        assert same(out, dev_bits) and layers == list(range(kv.shape[0]))
        out.zero_()
        assert tm.retrieve(toks, out) == 512 and same(out, dev_bits)


@cuda
def test_gpu_out_that_is_not_contiguous(kv):
    """Frames decoded in staging are copied asynchronously into a strided device view."""
    toks = list(range(512))
    with TierManager(ddr_bytes=64 << 20, namespace=NS) as tm:
        tm.store(toks, kv)
        assert tm.flush(30)
        backing = torch.zeros(kv.shape[0], kv.shape[1], kv.shape[3], kv.shape[2], kv.shape[4],
                              dtype=kv.dtype, device="cuda")
        out = backing.transpose(2, 3)
        layers = []
        assert tm.retrieve(toks, out, on_layer=layers.append) == 512
        assert same(out, kv) and layers == list(range(kv.shape[0]))
