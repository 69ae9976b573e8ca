"""Why Delta upserts stay copy-on-write (docs/tables.md, "Delta stays copy-on-write"): delta-rs refuses to
read a table with the deletion-vector reader feature, so a sink writing deletion vectors would make its table
unreadable to deltalake's pyarrow readers. When an upgrade reads them, this test fails: time to revisit."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaProtocolError


def test_deltalake_refuses_to_read_a_table_with_the_deletion_vector_feature(tmp_path: Path) -> None:
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]})
    write_deltalake(str(tmp_path), rows, configuration={"delta.enableDeletionVectors": "true"})
    table = DeltaTable(str(tmp_path))
    assert "deletionVectors" in (table.protocol().reader_features or [])
    with pytest.raises(DeltaProtocolError, match="deletionVectors"):
        table.to_pyarrow_table()
    with pytest.raises(DeltaProtocolError, match="deletionVectors"):
        table.to_pyarrow_dataset()
