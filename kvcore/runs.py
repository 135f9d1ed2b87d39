"""Which tensor views the codec decodes into directly: contiguous ones, and views made of
equal contiguous runs at one stride (a token range of a larger KV tensor)."""

from typing import Optional

import torch


def output_runs(t: torch.Tensor) -> Optional[tuple[int, int]]:
    """(run_bytes, stride_bytes) when t's elements, in row-major order, lie in equal
    contiguous runs that start stride_bytes apart; (0, 0) when t is contiguous; None
    for any other layout (a transposed or expanded view).

    >>> import torch
    >>> kv = torch.empty(4, 2, 256, 8, 128, dtype=torch.bfloat16)  # [layers, 2, tokens, heads, dim]
    >>> output_runs(kv[:, :, 64:128])  # 8 runs of 64 tokens, one per layer and K/V
    (131072, 524288)
    >>> output_runs(kv), output_runs(kv.transpose(3, 4)) is None
    ((0, 0), True)
    """
    if t.is_contiguous():
        return 0, 0
    dims = [(n, st) for n, st in zip(t.shape, t.stride()) if n != 1]
    run = 1  # elements in the contiguous suffix of dims
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    # The remaining dims must walk one stride: each steps over the whole next one.
    stride = dims[-1][1]
    for (_, outer), (n, inner) in zip(dims, dims[1:]):
        if outer != inner * n:
            return None
    if stride < run:
        return None
    size = t.element_size()
    return run * size, stride * size
