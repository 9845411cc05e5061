"""The DLPack boundary: any DLPack exporter becomes a core TensorView with the right dtype, shape, strides and
address, and anything else is refused with a message that names the argument."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.dlpack import to_dlpack

from ember import _C

DTYPES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float64: "float64",
}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("route", ["capsule", "protocol"])
def test_torch_tensors_of_every_dtype(dtype: torch.dtype, route: str) -> None:
    t = torch.zeros(2, 3, 4, dtype=dtype)
    obj = to_dlpack(t) if route == "capsule" else t
    name, sizes, strides, ptr, contiguous = _C.describe_tensor(obj)
    assert (name, sizes, strides, ptr, contiguous) == (DTYPES[dtype], (2, 3, 4), (12, 4, 1), t.data_ptr(), True)


def test_views_keep_strides_and_offsets() -> None:
    base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    view = base.transpose(0, 2)[1:, :, 1]
    _, sizes, strides, ptr, contiguous = _C.describe_tensor(to_dlpack(view))
    assert sizes == tuple(view.shape) and strides == view.stride()
    assert ptr == view.data_ptr() and not contiguous
    scalar = torch.tensor(3.0)
    assert _C.describe_tensor(scalar)[1:3] == ((), ())
    empty = torch.empty(0, 7)
    assert _C.describe_tensor(empty)[1] == (0, 7)


@pytest.mark.parametrize(
    ("np_dtype", "name"),
    [(np.float32, "float32"), (np.float16, "float16"), (np.int8, "int8"), (np.uint8, "uint8"), (np.int64, "int64")],
)
def test_numpy_arrays(np_dtype: type, name: str) -> None:
    a = np.zeros((4, 6), dtype=np_dtype)[:, ::2]
    got = _C.describe_tensor(a)
    assert got[0] == name and got[1] == (4, 3) and got[2] == (6, 2)
    assert got[3] == a.__array_interface__["data"][0]


def test_unsupported_dtypes_are_type_errors() -> None:
    with pytest.raises(TypeError, match=r"describe_tensor: obj has a dtype ember does not support"):
        _C.describe_tensor(torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(TypeError, match="does not support"):
        _C.describe_tensor(np.zeros(3, dtype=np.complex64))


def test_bool_tensors_where_torch_exports_them() -> None:
    try:
        capsule = to_dlpack(torch.zeros(3, dtype=torch.bool))
    except (RuntimeError, BufferError):  # torch 1.13: "Bool type is not supported by dlpack"
        pytest.skip(f"torch {torch.__version__} does not export bool tensors through DLPack")
    assert _C.describe_tensor(capsule)[0] == "bool"


def test_non_tensors_are_type_errors() -> None:
    for obj in ([1.0], 3.0, None, "x"):
        with pytest.raises(TypeError, match=r"describe_tensor: obj must be a tensor \(an object supporting DLPack\)"):
            _C.describe_tensor(obj)


def test_refused_exports_keep_the_producers_reason() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=r"obj could not be exported through DLPack: .*gradient"):
        _C.describe_tensor(p)


def test_a_capsule_cannot_be_used_twice() -> None:
    capsule = to_dlpack(torch.zeros(3))
    torch.utils.dlpack.from_dlpack(capsule)  # consumes it
    with pytest.raises(ValueError, match="not an unconsumed DLPack 'dltensor'"):
        _C.describe_tensor(capsule)


def test_borrowing_keeps_the_producer_alive() -> None:
    # The capsule returned by __dlpack__ is released after the call; the tensor's memory is untouched.
    t = torch.arange(10, dtype=torch.float32)
    for _ in range(1000):
        _C.describe_tensor(t)
    assert torch.equal(t, torch.arange(10, dtype=torch.float32))
    assert _C.convert_tensors(t, to_dlpack(t), np.zeros(2, np.float32)) == 3
