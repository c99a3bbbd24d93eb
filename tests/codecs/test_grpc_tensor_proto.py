"""``servekit.codecs.tensor_proto`` against TensorFlow's own conversions, in every dtype."""

from __future__ import annotations

import numpy as np
import pytest
from lazy_modules import lazy_module
from servekit.codecs import tensor_proto
from servekit.errors import BadRequest
from servekit.protocols.grpc.protos.tensorflow.core.framework import tensor_pb2

# needs torch or TensorFlow (or TF Serving's protos, which import TensorFlow): out of the quick lane
pytestmark = pytest.mark.slow
tf = lazy_module("tensorflow")  # imported by the first test that uses it, not at collection
ml_dtypes = pytest.importorskip("ml_dtypes")
tf_tensor_pb2 = lazy_module("tensorflow.core.framework.tensor_pb2")

DTYPES = [
    np.float32,
    np.float64,
    np.float16,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
    np.complex64,
    np.complex128,
    ml_dtypes.bfloat16,
    ml_dtypes.float8_e5m2,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e4m3b11fnuz,
    ml_dtypes.float8_e5m2fnuz,
    ml_dtypes.int4,
    ml_dtypes.uint4,
]

#: ``tf.make_ndarray`` reads these from tensor_content only, not from float8_val.
TF_CANNOT_READ_FLOAT8_VAL = {"float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e5m2fnuz"}


def sample(dtype) -> np.ndarray:
    values = np.array([[0, 1, 2], [3, 4, 5]])
    if np.dtype(dtype).kind in "fc" or np.dtype(dtype).name.startswith(("bfloat", "float8")):
        values = values - 2.5  # negative and fractional where the dtype has them
    if np.dtype(dtype) == np.dtype(ml_dtypes.int4) or np.dtype(dtype).kind == "i":
        values = values - 3
    if np.dtype(dtype).kind == "c":
        values = values + 1j * values[::-1]
    return values.astype(dtype)


def to_tf(message) -> np.ndarray:
    return tf.make_ndarray(tf_tensor_pb2.TensorProto.FromString(message.SerializeToString()))


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("content", [True, False], ids=["tensor_content", "typed_field"])
def test_encode_reads_back_in_tensorflow(dtype, content):
    value = sample(dtype)
    message = tensor_proto.from_numpy(value, tensor_pb2.TensorProto(), use_tensor_content=content)
    assert bool(message.tensor_content) == content
    if not content and np.dtype(dtype).name in TF_CANNOT_READ_FLOAT8_VAL:
        assert message.float8_val == value.view(np.uint8).tobytes()
    else:
        assert same(to_tf(message), value)
    assert same(tensor_proto.to_numpy(message), value)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_decode_what_tensorflow_writes(dtype):
    value = sample(dtype)
    theirs = tf.make_tensor_proto(value)
    decoded = tensor_proto.to_numpy(tensor_pb2.TensorProto.FromString(theirs.SerializeToString()))
    assert same(decoded, value)


def test_strings_both_ways():
    value = np.array([[b"a", "caf\u00e9"], [b"\x00\xff", ""]], dtype=object)
    message = tensor_proto.from_numpy(value, tensor_pb2.TensorProto())
    assert to_tf(message).tolist() == [[b"a", "caf\u00e9".encode()], [b"\x00\xff", b""]]
    decoded = tensor_proto.to_numpy(
        tensor_pb2.TensorProto.FromString(tf.make_tensor_proto(["x", "yy"]).SerializeToString())
    )
    assert decoded.dtype == object and decoded.tolist() == [b"x", b"yy"]


def test_numpy_unicode_and_scalars():
    message = tensor_proto.from_numpy(np.array(["ab", "c"]), tensor_pb2.TensorProto())
    assert list(message.string_val) == [b"ab", b"c"]
    scalar = tensor_proto.from_numpy(np.float32(2.5), tensor_pb2.TensorProto())
    assert len(scalar.tensor_shape.dim) == 0 and to_tf(scalar) == np.float32(2.5)


def typed(dtype_enum, shape, **fields) -> tensor_pb2.TensorProto:
    message = tensor_pb2.TensorProto(dtype=dtype_enum)
    for size in shape:
        message.tensor_shape.dim.add(size=size)
    for name, values in fields.items():
        if isinstance(values, bytes):
            setattr(message, name, values)
        else:
            getattr(message, name).extend(values)
    return message


@pytest.mark.parametrize(
    "message",
    [
        typed(1, [2, 3], float_val=[7.0]),
        typed(1, [2, 3], float_val=[1.0, 2.0]),
        typed(3, [4], int_val=[]),
        typed(7, [3], string_val=[b"a"]),
        typed(8, [2], scomplex_val=[1.0, 2.0]),
        typed(19, [3], half_val=[15360]),
    ],
    ids=[
        "one-value-fills",
        "last-value-fills",
        "empty-is-zeros",
        "string-fills",
        "complex-fills",
        "half-fills",
    ],
)
def test_fewer_values_than_the_shape_fill_as_tensorflow_does(message):
    assert same(tensor_proto.to_numpy(message), to_tf(message))


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        (typed(1, [2], float_val=[1.0, 2.0, 3.0]), "room for 2"),
        (typed(1, [2], tensor_content=b"\x00" * 7), "needs 8"),
        (typed(6, [1], int_val=[300]), "out of range"),
        (typed(17, [1], int_val=[-1]), "out of range"),
        (typed(19, [1], half_val=[70000]), "16-bit"),
        (typed(8, [1], scomplex_val=[1.0, 2.0, 3.0]), "pairs"),
        (typed(10, [2], tensor_content=b"\x00\x02"), "0 or 1"),
        (typed(0, [1]), "DT_INVALID"),
        (typed(11, [1], int_val=[1]), "DT_QINT8"),
        (typed(20, [1]), "DT_RESOURCE"),
        (typed(101, [1], float_val=[1.0]), "reference"),
        (typed(1, [-1], float_val=[1.0]), "negative"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_tensors_are_refused(message, fragment):
    with pytest.raises(BadRequest) as info:
        tensor_proto.to_numpy(message, "input 'x'")
    assert fragment in info.value.message
    assert "input 'x'" in info.value.message or fragment in (
        "DT_INVALID",
        "DT_QINT8",
        "DT_RESOURCE",
        "reference",
    )


def test_unknown_rank_is_refused():
    message = typed(1, [], float_val=[1.0])
    message.tensor_shape.unknown_rank = True
    with pytest.raises(BadRequest, match="unknown_rank"):
        tensor_proto.to_numpy(message)


def test_decoded_arrays_are_writable():
    message = tensor_proto.from_numpy(np.arange(4, dtype=np.int32), tensor_pb2.TensorProto())
    decoded = tensor_proto.to_numpy(message)
    decoded[0] = 9  # a model may change its inputs in place
    assert decoded.flags.writeable


def test_big_endian_arrays_are_written_little_endian():
    value = np.arange(3, dtype=">i4")
    message = tensor_proto.from_numpy(value, tensor_pb2.TensorProto())
    assert message.tensor_content == np.arange(3, dtype="<i4").tobytes()
