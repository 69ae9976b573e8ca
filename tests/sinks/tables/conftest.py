"""Fixtures of the table sink tests: a local or moto-S3 target for each table format."""

from __future__ import annotations

import pytest

from tests.sinks.conftest import MotoS3
from tests.sinks.tables.helpers import KINDS, Target


@pytest.fixture(params=KINDS)
def local_target(request: pytest.FixtureRequest, tmp_path) -> Target:  # type: ignore[no-untyped-def]
    return Target(request.param, str(tmp_path / "lake"), {}, str(tmp_path))


@pytest.fixture(params=KINDS)
def s3_target(request: pytest.FixtureRequest, moto_s3: MotoS3, tmp_path) -> Target:  # type: ignore[no-untyped-def]
    return s3_target_of(request.param, moto_s3, str(tmp_path))


def s3_target_of(kind: str, s3: MotoS3, tmp: str) -> Target:
    return Target(kind, f"s3://{s3.new_bucket()}/lake", s3.options(), tmp)
