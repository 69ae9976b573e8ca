"""The built-in sinks' options: frozen models checked when the sink is built, handed to the sink's helpers
(writers, committers, compactors, table formats) instead of the sink itself."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sluice import ConfigError, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.sinks.delta import DeltaSink
from sluice.sinks.files import FileSink
from sluice.sinks.iceberg import IcebergSink

from tests.sinks.conftest import Ctx


class GCtx:
    job_id, sink_uid, attempt, restored_checkpoint_id = "job", "sink", 0, None

    def metric(self, name: str, increment: int = 1) -> None:
        pass

    def fault_hook(self, point: str) -> None:
        pass


def sinks(tmp_path: Path) -> list[Any]:
    return [
        FileSink(str(tmp_path / "files"), compaction=True),
        DeltaSink(str(tmp_path / "delta")),
        IcebergSink("db.t", warehouse=str(tmp_path / "warehouse")),
    ]


def helpers(sink: Any) -> list[Any]:
    made = [sink.create_writer(Ctx(), []), sink.create_compactor(Ctx())]
    if sink.global_commit:
        made += [sink.create_global_committer(GCtx()), sink.table_format()]
    else:
        made.append(sink.create_committer(Ctx()))
    return made


def test_helpers_are_handed_the_options_never_the_sink(tmp_path: Path) -> None:
    for sink in sinks(tmp_path):
        for helper in helpers(sink):
            fields = vars(helper)
            assert all(v is not sink for v in fields.values()), f"{type(helper).__name__} holds the sink"
            options = fields.get("options", getattr(fields.get("fmt"), "options", sink.options))
            assert options is sink.options, type(helper).__name__  # (the file compactor gets its parts)
            close = getattr(helper, "close", None)
            if close is not None:
                close()


def test_options_are_frozen_and_travel_with_the_sink(tmp_path: Path) -> None:
    for sink in sinks(tmp_path):
        with pytest.raises(ValidationError, match="frozen"):
            sink.options.name = "other"
        assert pickle.loads(pickle.dumps(sink)).options == sink.options
        assert "storage_options" not in repr(sink.options)  # may hold credentials


def test_an_option_assigned_after_construction_is_checked_when_the_pipeline_is_built(tmp_path: Path) -> None:
    for sink in sinks(tmp_path):
        sink.compression = "lzma"
        assert sink.compression == "lzma"
        p = Pipeline("options")
        with pytest.raises(ConfigError, match="compression") as err:
            p.source(GeneratorSource()).sink(sink)
        assert "\n" not in str(err.value) and "'lzma'" in str(err.value)
