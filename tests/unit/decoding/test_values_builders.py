"""Arrays built from buffers (``vector.string_array``, ``repeated_string``, ``with_mask``, ``uuid_strings``) equal what ``pa.array``
builds from the same Python values (the reference), and never import pandas (``pa.array`` does on first use)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding.values import vector
from airflow_provider_pglogical.decoding.values.text import UuidCodec
from airflow_provider_pglogical.decoding.values.vector import Column, repeated_string, string_array, with_mask
from airflow_provider_pglogical.exceptions import DecodeError
from airflow_provider_pglogical.staging.drain import DrainConfig

text = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(text, max_size=30))
def test_string_array_equals_pa_array(values):
    built = string_array(values, "values")
    built.validate(full=True)
    assert built.equals(pa.array(values, type=pa.string()))


@settings(max_examples=200, deadline=None)
@given(text, st.integers(0, 50))
def test_repeated_string_equals_pa_array(value, n):
    built = repeated_string(value, n, "values")
    built.validate(full=True)
    assert built.equals(pa.array([value] * n, type=pa.string()))


# The types the snapshot sink and the converter build with ``with_mask``, and the numpy arrays they pass.
WITH_MASK_TYPES = {pa.int64(): (st.integers(-2**63, 2**63 - 1), np.int64),
                   pa.timestamp("us", tz="UTC"): (st.integers(-2**63, 2**63 - 1), np.int64),
                   pa.int32(): (st.integers(-2**31, 2**31 - 1), np.int32),
                   pa.bool_(): (st.booleans(), np.bool_)}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_with_mask_equals_pa_array(data):
    arrow_type = data.draw(st.sampled_from(list(WITH_MASK_TYPES)))
    strategy, dtype = WITH_MASK_TYPES[arrow_type]
    values = data.draw(st.lists(strategy, max_size=30))
    mask = data.draw(st.none() | st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
    built = with_mask(np.array(values, dtype=dtype), None if mask is None else np.array(mask, dtype=bool), arrow_type)
    built.validate(full=True)
    expected = pa.array(values if mask is None else [None if m else v for v, m in zip(values, mask, strict=True)],
                        type=arrow_type)
    assert built.equals(expected)
    def plain(array: pa.Array) -> list:  # the values (timestamps as their µs: not all fit a datetime)
        return (array.cast(pa.int64()) if pa.types.is_timestamp(array.type) else array).to_pylist()

    assert plain(built) == plain(expected) == [None if mask and mask[i] else v for i, v in enumerate(values)]


def test_an_array_over_2_gib_names_itself_and_the_setting_that_bounds_it(monkeypatch):
    """The error names the array and a setting that exists: the decode's ``row_group_rows`` (``DrainConfig``, the
    decode operator's argument), which bounds how many entries one array holds."""
    monkeypatch.setattr(vector, "_INT32_MAX", 4)
    with pytest.raises(DecodeError, match=r"^public\.t: value-note paths: 5 bytes in 2 entries, over the 2 GiB one "
                                          r"Arrow string array holds; .*\(the decode's row_group_rows\)$"):
        string_array(["abc", "de"], "public.t: value-note paths")
    with pytest.raises(DecodeError, match=r"^public\.t: op: 5 bytes in 5 entries.*row_group_rows"):
        repeated_string("I", 5, "public.t: op")
    assert "row_group_rows" in {f.name for f in dataclasses.fields(DrainConfig)}


def test_builders_do_not_import_pandas():
    code = ("import sys, numpy as np, pyarrow as pa\n"
            "from airflow_provider_pglogical.decoding.values.vector import repeated_string, string_array, with_mask\n"
            "string_array(['a', 'é'], 'a'); string_array([], 'b'); repeated_string('I', 3, 'c')\n"
            "with_mask(np.ones(3, dtype=bool), np.array([True, False, False]), pa.bool_())\n"
            "with_mask(np.ones(3, dtype=np.int32), None, pa.int32())\n"
            "print('pandas' in sys.modules)")
    assert _printed_by(code) == "False"


def _printed_by(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (imports and module state of its own)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.just("u"), st.binary(min_size=16, max_size=16)), max_size=30))
def test_uuid_strings_equal_pa_array_of_the_per_value_codec(values):
    """The uuid column built from buffers equals ``pa.array`` of the codec's per-value strings (``str(uuid.UUID)``);
    'n' and 'u' rows are nulls."""
    kinds = "".join("n" if v is None else "u" if v == "u" else "b" for v in values)
    col = Column.from_raws(kinds, [v if isinstance(v, bytes) else None for v in values])
    built = UuidCodec().arrow_column(col)
    assert built is not None
    built.validate(full=True)
    expected = pa.array([str(uuid.UUID(bytes=v)) if isinstance(v, bytes) else None for v in values], type=pa.string())
    assert built.equals(expected)


def test_uuid_strings_leave_text_values_and_wrong_sizes_to_the_per_value_path():
    assert UuidCodec().arrow_column(Column.from_raws("bt", [bytes(16), b"0" * 36])) is None
    assert UuidCodec().arrow_column(Column.from_raws("b", [bytes(15)])) is None


@pytest.mark.parametrize("path", ["compiled", "numpy"])
def test_value_slices_outside_their_buffer_are_a_decode_error_naming_the_column(monkeypatch, path):
    """A text column whose slices do not fit the row images' buffer (a framing fault) is the decoder's one-line
    ``DecodeError`` naming the column, from the C gather and from its numpy reference alike."""
    from airflow_provider_pglogical.decoding.values.arrow import RowImageConverter
    from airflow_provider_pglogical.decoding.values.text import TextCodec

    if path == "numpy":
        monkeypatch.setattr(vector, "_gather_slices_c", None)
    elif vector._gather_slices_c is None:
        pytest.skip("compiled helpers not built")
    good = Column.from_raws("bb", [b"ab", b"cd"])
    bad = Column(good.kinds, good.data, good.buf, good.starts, good.lengths + [0, len(good.data)])
    with pytest.raises(DecodeError, match=r"^column note: row images' value bytes: gather_slices: slice 1 is outside "
                                          r"the buffer or the total$"):
        RowImageConverter._column("note", TextCodec(), bad, {})


def test_a_compiled_module_without_the_gather_types_with_the_numpy_path():
    """A compiled module built before ``gather_slices`` existed (a stale build) leaves text columns to numpy."""
    code = ("import types\n"
            "from airflow_provider_pglogical.decoding import speedups\n"
            "speedups.compiled = types.SimpleNamespace()\n"
            "import pyarrow as pa\n"
            "from airflow_provider_pglogical.decoding.values.vector import Column, varlena\n"
            "print(varlena(Column.from_raws('bnb', [b'ab', None, b'cde']), pa.string()).to_pylist())")
    assert _printed_by(code) == "['ab', None, 'cde']"
