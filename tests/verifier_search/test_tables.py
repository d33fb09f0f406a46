"""The FastTTS runner's tables are row dicts written without pandas (harness/records.py
``_arrow_table``): the Arrow table equals pyarrow's own inference for every column kind they hold."""

import random

import pyarrow as pa

from harness.records import _arrow_table


def test_rows_written_as_pyarrow_infers_them():
    """ints, floats, floats with None (a path without scores), all None (a simulated run's CPU
    seconds), str with non-ASCII and empty strings, and bool (left to pyarrow): the same
    schema and values as ``pa.Table.from_pylist``. Mutations caught: the validity bitmap in big-endian
    bit order, string offsets shifted by one (``cumsum`` into ``offsets[:-1]``), a float column with
    None written without its bitmap (NaN-free zeros)."""
    rnd = random.Random(5)
    rows = [
        {
            "problem": i,
            "time_s": rnd.random(),
            "score": rnd.choice([None, rnd.random()]),
            "cpu_s": None,
            "uid": rnd.choice(["0.1", "ü.2", "", "12.3.4"]),
            "last": i % 3 == 0,
        }
        for i in range(37)
    ]
    rows[0]["score"] = 0.5  # the column holds floats and None
    got, want = _arrow_table(rows), pa.Table.from_pylist(rows)
    assert got.schema == want.schema
    assert got.equals(want)
    assert _arrow_table([]).num_columns == 0
