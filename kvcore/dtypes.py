"""Element types kvcore codes, and their codes in the frame format."""

from typing import Any

import numpy as np
import torch

from .errors import InvalidArgumentError

# Frame dtype codes (docs/FORMAT.md); never renumber.
_TORCH_TO_CODE = {
    torch.uint8: 1,
    torch.int8: 2,
    torch.float8_e4m3fn: 3,
    torch.float8_e5m2: 4,
    torch.float16: 5,
    torch.bfloat16: 6,
    torch.float32: 7,
}
_CODE_TO_TORCH = {code: dt for dt, code in _TORCH_TO_CODE.items()}
_NUMPY_TO_TORCH = {
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
}

SUPPORTED = tuple(str(dt).removeprefix("torch.") for dt in _TORCH_TO_CODE)


def code_of(dtype: torch.dtype) -> int:
    try:
        return _TORCH_TO_CODE[dtype]
    except (KeyError, TypeError):  # TypeError: not hashable, so no dtype
        raise InvalidArgumentError(f"kvcore does not code {dtype}; supported: {', '.join(SUPPORTED)}") from None


def code_or_zero(dtype: torch.dtype) -> int:
    """The frame code of dtype, or 0 (no frame's) for one kvcore does not code."""
    return _TORCH_TO_CODE.get(dtype, 0)


def torch_dtype(code: int) -> torch.dtype:
    return _CODE_TO_TORCH[code]


def torch_dtype_of_numpy(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (ml_dtypes' bfloat16 and float8 included)."""
    dt = np.dtype(dtype)
    if not dt.isnative:  # its bytes are copied as they lie: swapped, they would be other values
        raise InvalidArgumentError(
            f"numpy dtype {dt.name} in non-native byte order ({dt.str}) is not coded: "
            f"convert it first, with x.astype(x.dtype.newbyteorder('='))")
    if dt in _NUMPY_TO_TORCH:
        return _NUMPY_TO_TORCH[dt]
    by_name = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
    if dt.name in by_name:
        return by_name[dt.name]
    raise InvalidArgumentError(f"kvcore does not code numpy dtype {dt}; supported: {', '.join(SUPPORTED)}")
