"""The checkpoint format (issue 22): plain data as JSON, the signed task-state container, the signed
``_metadata``, and the checkpoint key. Decoding is strict and never runs code before the HMAC verified."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import pickle
import stat
import uuid
import zoneinfo
from pathlib import Path
from typing import Any

import pytest
from sluice import CheckpointConfig, ConfigError, RestoreError
from sluice.checkpoint.codec import MetadataCodec, seal_metadata, verify_metadata
from sluice.checkpoint.payload import decode_task_state, encode_task_state, without_channel_state
from sluice.checkpoint.signing import key_id
from sluice.config.checkpoint_key import KEY_ENV, default_key_file, resolve_key
from sluice.serializers import plain

KEY = b"format-test-key-0123456789abcdef"


class Planted:
    """Loading this pickle creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


VALUES: list[Any] = [
    None, True, 0, -(2**70), 1.5, float("inf"), float("-inf"), "text", "", b"\x00\x80raw", [], [1, [2]],
    (1, "a", (None,)), {"a": 1}, {"$": "not a tag"}, {1: "int key", (2, "t"): [b"x"]},
    datetime.date(2024, 2, 29), datetime.datetime(2024, 1, 1, 12, 30, 0, 5),
    datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=-3))),
    datetime.datetime(2024, 7, 1, 9, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
    datetime.time(23, 59, 1), decimal.Decimal("-12.3400"), uuid.UUID(int=7),
]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v)[:30] for v in VALUES])
def test_plain_values_round_trip_through_json(value: Any) -> None:
    back = plain.decode(json.loads(json.dumps(plain.encode(value), allow_nan=False)))
    assert back == value and type(back) is type(value)
    if isinstance(value, datetime.datetime):
        assert back.tzinfo == value.tzinfo or back.utcoffset() == value.utcoffset()


def test_nan_round_trips() -> None:
    back = plain.decode(json.loads(json.dumps(plain.encode(float("nan")), allow_nan=False)))
    assert back != back


@pytest.mark.parametrize(
    "tree",
    [
        {"$": "nope", "v": 1},
        {"$": "tuple", "v": [], "x": 1},
        {"$": "b64", "v": "!!"},
        {"$": "map", "v": [[1]]},
        {"$": "pickle", "v": 0},
        {"$": "bytes", "v": 0},
        {"$": "float", "v": "1e9"},
        {"$": "datetime", "v": "2024-01-01T00:00:00+00:00[No/Such_Zone]"},
    ],
)
def test_plain_decoding_is_strict(tree: Any) -> None:
    with pytest.raises(plain.PlainFormatError):
        plain.decode(tree)


def test_values_that_are_not_plain_are_refused_or_given_to_the_fallback() -> None:
    with pytest.raises(plain.NotPlainError):
        plain.encode({"a": {1, 2}})
    assert plain.encode({"a": {1, 2}}, fallback=lambda v: {"$": "pickle", "v": 9}) == {"a": {"$": "pickle", "v": 9}}


def payload(marker: Path | None = None) -> dict[str, Any]:
    return {
        "operators": {
            "op": {"keyed": {3: b"blob", 4: b""}, "operator": {"writer": None, "pending": [[2, [{"v": 1, "data": b"{}"}]]]}},
            "user": {"keyed": {}, "operator": [(0, 5, 3, ("k", 1)), Planted(marker) if marker else {1, 2}]},
        },
        "splits": [{"v": 1, "data": b'{"id":"0"}'}],
        "input_state": [(0, b"\xff\xff\xff\xffipc")],
        "output_state": [(1, b"\xff\xff\xff\xffmore")],
    }


def test_a_state_file_round_trips() -> None:
    data = encode_task_state(payload(), KEY)
    back = decode_task_state(data, KEY, "f.state")
    assert back == payload()
    with pytest.raises(RestoreError, match=r"f\.state holds pickled state"):
        decode_task_state(data, KEY, "f.state", allow_pickle=False)
    plain_only = {**payload(), "operators": {"op": payload()["operators"]["op"]}}
    assert decode_task_state(encode_task_state(plain_only, KEY), KEY, "f", allow_pickle=False) == plain_only


def test_every_modified_byte_of_a_state_file_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = encode_task_state(payload(marker), KEY)
    assert not marker.exists()
    for i in range(0, len(data), 7):
        bad = bytearray(data)
        bad[i] ^= 0x20
        with pytest.raises(RestoreError) as info:
            decode_task_state(bytes(bad), KEY, "x.state")
        assert "x.state" in str(info.value) and "\n" not in str(info.value)
    for cut in (0, 10, len(data) - 1):
        with pytest.raises(RestoreError, match=r"x\.state"):
            decode_task_state(data[:cut], KEY, "x.state")
    assert not marker.exists()


def test_wrong_key_old_format_and_other_versions_are_refused_by_name(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = encode_task_state(payload(marker), KEY)
    with pytest.raises(RestoreError, match=rf"a\.state does not verify .* \(key id {key_id(b'x' * 32)}\); it names key id {key_id(KEY)}"):
        decode_task_state(data, b"x" * 32, "a.state")
    with pytest.raises(RestoreError, match=r"a\.state is a pickle, not a sluice state file"):
        decode_task_state(pickle.dumps(Planted(marker), protocol=5), KEY, "a.state")
    with pytest.raises(RestoreError, match=r"a\.state has checkpoint format version 2"):
        decode_task_state(data[:8] + b"\x00\x02" + data[10:], KEY, "a.state")
    with pytest.raises(RestoreError, match="not a sluice checkpoint state file"):
        decode_task_state(b"PAR1" + data, KEY, "a.state")
    assert not marker.exists()


def test_a_finished_tasks_state_drops_channel_state_without_unpickling_user_state(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    data = encode_task_state(payload(marker), KEY)
    again = without_channel_state(data, KEY, "t.state")
    assert not marker.exists()
    with pytest.raises(RestoreError, match="holds pickled state"):  # the user state is still a pickle
        decode_task_state(again, KEY, "t.state", allow_pickle=False)
    restored = decode_task_state(again, KEY, "t.state")
    assert marker.exists()  # only a full decode with the right key loads it (user state, signed)
    assert restored["input_state"] == [] and restored["output_state"] == []
    assert restored["operators"]["op"] == payload()["operators"]["op"]


def test_metadata_is_sealed_and_verified() -> None:
    meta = {"checkpoint_id": 3, "tasks": {"0.0": {"path": "/x", "stats": {"sync_s": 0.1}}}, "kgs": {1: 2}}
    codec = MetadataCodec(KEY)
    meta["enumerators"] = {"src": codec.enumerator_state("src", {"pending": [(1, 2)]})}
    meta["global_committables"] = codec.global_committables({"sink": [(2, ["a", b"b"])]})
    stored = json.loads(json.dumps(seal_metadata(meta, KEY), indent=1, sort_keys=True))
    verify_metadata(stored, KEY, "m")
    assert stored["key_id"] == key_id(KEY) and stored["format"] == 1
    for change in (
        lambda m: m.update(checkpoint_id=4),
        lambda m: m["tasks"]["0.0"].update(path="/etc/passwd"),
        lambda m: m["enumerators"].update(src=plain.encode({"v": 1, "data": b"other"})),
    ):
        bad = json.loads(json.dumps(stored))
        change(bad)
        with pytest.raises(RestoreError, match="m failed authentication"):
            verify_metadata(bad, KEY, "m")
    with pytest.raises(RestoreError, match="m does not verify with this job's checkpoint key"):
        verify_metadata(stored, b"y" * 32, "m")
    with pytest.raises(RestoreError, match="m is not signed"):
        verify_metadata({k: v for k, v in stored.items() if k != "mac"}, KEY, "m")


def test_the_key_comes_from_the_option_then_the_environment_then_a_private_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(KEY_ENV, raising=False)
    path = default_key_file()
    assert path == tmp_path / "config" / "sluice" / "checkpoint.key" and not path.exists()
    first = resolve_key()
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert resolve_key() == first and len(first) >= 32  # created once, then read
    assert CheckpointConfig().resolved_key() == first
    monkeypatch.setenv(KEY_ENV, "from-the-environment-0123456789")
    assert resolve_key() == b"from-the-environment-0123456789"
    assert CheckpointConfig(key="from-the-option-0123456789").resolved_key() == b"from-the-option-0123456789"
    monkeypatch.delenv(KEY_ENV)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match=r"checkpoint key file .* is open to other users \(mode 644\): run chmod 600"):
        resolve_key()


def test_keys_are_checked_and_never_shown() -> None:
    with pytest.raises(ConfigError, match="key must have at least 16 characters") as info:
        CheckpointConfig(key="short-secret")
    assert "short-secret" not in str(info.value)
    cfg = CheckpointConfig(key="a-long-enough-secret-key")
    assert "a-long-enough-secret-key" not in repr(cfg) and "a-long-enough-secret-key" not in str(cfg.model_dump())
    assert cfg.with_resolved_key() is cfg
    resolved = CheckpointConfig(storage="/x").with_resolved_key()
    assert resolved.key is not None and resolved.storage == "/x"
