"""Arrays built from buffers (``vector.string_array``, ``repeated_string``, ``with_mask``) equal what ``pa.array``
builds from the same Python values (the reference), and never import pandas (``pa.array`` does on first use)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.decoding.values.vector import repeated_string, string_array, with_mask

text = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(text, max_size=30))
def test_string_array_equals_pa_array(values):
    built = string_array(values)
    built.validate(full=True)
    assert built.equals(pa.array(values, type=pa.string()))


@settings(max_examples=200, deadline=None)
@given(text, st.integers(0, 50))
def test_repeated_string_equals_pa_array(value, n):
    built = repeated_string(value, n)
    built.validate(full=True)
    assert built.equals(pa.array([value] * n, type=pa.string()))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=30),
       st.sampled_from([pa.int64(), pa.timestamp("us", tz="UTC")]))
def test_with_mask_equals_pa_array(values, arrow_type):
    built = with_mask(np.array(values, dtype=np.int64), None, arrow_type)
    assert built.equals(pa.array(np.array(values, dtype=np.int64)).cast(arrow_type))


def test_builders_do_not_import_pandas():
    code = ("import sys, numpy as np, pyarrow as pa\n"
            "from airflow_provider_pglogical.decoding.values.vector import repeated_string, string_array, with_mask\n"
            "string_array(['a', 'é']); string_array([]); repeated_string('I', 3)\n"
            "with_mask(np.ones(3, dtype=bool), None, pa.bool_())\n"
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
