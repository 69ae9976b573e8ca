"""The worked examples of docs/connectors.md, as they stand in the page, pass the conformance kit."""

from __future__ import annotations

import itertools
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pjson
import pytest
from sluice.testing.conformance import (
    SINK_CHECKS,
    SOURCE_CHECKS,
    SinkCase,
    SinkTarget,
    SourceCase,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "connectors.md"


def example(name: str) -> types.ModuleType:
    """The ``<!-- example: name -->`` code block of docs/connectors.md, as an importable module."""
    m = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)\n```", DOC.read_text(), re.S)
    assert m, f"docs/connectors.md has no example {name!r}"
    mod = types.ModuleType(f"docs_connectors_{name}")
    sys.modules[mod.__name__] = mod  # the kit pickles splits and committables: their classes must import
    exec(compile(m.group(1), f"docs/connectors.md ({name})", "exec"), mod.__dict__)
    return mod


@pytest.mark.parametrize("check", SOURCE_CHECKS)
def test_tail_source_example(check: str, tmp_path: Path) -> None:
    tail = example("tail_source")
    expected = []
    for f in range(4):
        lines = [f"file {f} line {i} " + "x" * (i % 7) for i in range(60 + 11 * f)]
        (tmp_path / f"app-{f}.log").write_text("".join(line + "\n" for line in lines))
        offset = 0
        for line in lines:
            expected.append({"file": f"app-{f}.log", "offset": offset, "line": line})
            offset += len(line) + 1
    (tmp_path / "notes.txt").write_text("not a log\n")
    source: Any = tail.TailSource(str(tmp_path), bounded=True, max_bytes=300)
    SOURCE_CHECKS[check](SourceCase(source, pa.Table.from_pylist(expected), columns=["file", "offset", "line"]))


@pytest.mark.parametrize("check", SINK_CHECKS)
def test_jsonl_sink_example(check: str, tmp_path: Path) -> None:
    jsonl = example("jsonl_sink")
    folders = itertools.count()

    def target() -> SinkTarget:
        folder = tmp_path / f"out-{next(folders)}"

        def visible() -> pa.Table | None:
            files = sorted(folder.glob("part-*.jsonl")) if folder.is_dir() else []
            return pa.concat_tables([pjson.read_json(f) for f in files]) if files else None

        def staged() -> list[str]:
            return sorted(n for n in os.listdir(folder) if n.startswith(".")) if folder.is_dir() else []

        return SinkTarget(jsonl.JsonLinesSink(str(folder)), visible, staged)

    SINK_CHECKS[check](SinkCase(target, columns=["id", "key", "value"]))
