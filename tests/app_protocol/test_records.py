"""The array codec of the records: what ``encode_array`` writes, what ``decode_array`` gives back and refuses."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array
from flwr.app.message.array import SType

from app_protocol import records

ARRAYS = {
    "float32 matrix": np.arange(12, dtype=np.float32).reshape(3, 4),
    "float64 scalar": np.array(3.5),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "big-endian int": np.array([1, -2, 3], dtype=">i4"),
    "float16": np.linspace(-1, 1, 6, dtype=np.float16).reshape(2, 3),
    "bool": np.array([True, False, True]),
    "int64 4-d": np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5),
}


@pytest.mark.parametrize("name", ARRAYS)
def test_decoding_gives_what_flower_decodes(name: str) -> None:
    array = Array(ARRAYS[name])
    decoded = records.decode_array(array)
    expected = array.numpy()
    assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
    np.testing.assert_array_equal(decoded, expected)


@pytest.mark.parametrize("name", [*ARRAYS, "fortran order", "strided view"])
def test_encoding_gives_flowers_array_of_the_c_ordered_values_byte_for_byte(name: str) -> None:
    value = {"fortran order": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
             "strided view": np.arange(20, dtype=np.float32).reshape(4, 5)[::2, 1:4]}.get(name, ARRAYS.get(name))
    ours, flowers = records.encode_array(value), Array(np.require(value, requirements="C"))
    assert ours.__dict__ == flowers.__dict__
    np.testing.assert_array_equal(ours.numpy(), value)


def test_an_object_array_is_left_to_flower_which_refuses_it() -> None:
    with pytest.raises(ValueError, match="allow_pickle"):
        records.encode_array(np.array([{"a": 1}], dtype=object))


def test_the_decoded_array_is_a_writable_copy_of_the_message_data() -> None:
    array = Array(np.zeros(4, dtype=np.float32))
    decoded = records.decode_array(array)
    decoded += 1.0
    np.testing.assert_array_equal(records.decode_array(array), np.zeros(4, dtype=np.float32))


def test_a_fortran_ordered_array_keeps_its_element_order() -> None:
    fortran = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(records.decode_array(Array(fortran)), fortran)


def test_a_version_2_header_is_read() -> None:
    values = np.arange(5, dtype=np.float32)
    magic_and_size = records.NPY_MAGIC + bytes([2, 0])
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }".ljust(118) + b"\n"
    data = magic_and_size + len(header).to_bytes(4, "little") + header + values.tobytes()
    array = Array(dtype="float32", shape=(5,), stype=SType.NUMPY, data=data)
    np.testing.assert_array_equal(records.decode_array(array), values)


@pytest.mark.parametrize(("dtype", "shape"), [("float32", (4,)), ("float64", (3,)), ("object", (3,))])
def test_fields_that_do_not_match_the_data_raise_value_error(dtype: str, shape: tuple[int, ...]) -> None:
    good = Array(np.arange(3, dtype=np.float32))
    bad = Array(dtype=dtype, shape=shape, stype=SType.NUMPY, data=good.data)
    with pytest.raises(ValueError):
        records.decode_array(bad)


def test_records_round_trip_through_the_codec() -> None:
    weights = {"a": np.ones((2, 2), dtype=np.float32), "b": np.arange(3.0)}
    decoded = records.from_record(records.to_record(weights))
    assert decoded.keys() == weights.keys()
    for key in weights:
        np.testing.assert_array_equal(decoded[key], weights[key])
    models = records.models_from_record(records.models_to_record([weights, weights]), 2)
    np.testing.assert_array_equal(models[1]["b"], weights["b"])
