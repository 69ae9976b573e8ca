"""Reads every completed checkpoint under a storage folder strictly, to prove what it holds is data.

``_metadata`` must verify with the key; every ``.state`` file must verify and decode with pickle sections
refused; every bytes value inside (serialized splits, committables, writer states, enumerator states,
channel state) must be JSON or an Arrow IPC stream, never a pickle.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
from sluice.checkpoint.codec import from_metadata, verify_metadata
from sluice.checkpoint.payload import decode_task_state

__all__ = ["assert_no_pickle"]

_IPC = b"\xff\xff\xff\xff"  # an Arrow IPC stream's first message starts with the continuation marker


def assert_no_pickle(storage: Path, key: bytes) -> collections.Counter[str]:
    """Scan every checkpoint and savepoint under ``storage`` (``<job>/<chk-n>/``); returns what it saw."""
    seen: collections.Counter[str] = collections.Counter()
    for meta_path in sorted(storage.glob("*/*/_metadata")):
        meta = json.loads(meta_path.read_text())
        verify_metadata(meta, key, str(meta_path))
        for section in ("enumerators", "global_committables"):
            for tree in (meta.get(section) or {}).values():
                _walk(from_metadata(tree, str(meta_path)), seen, f"{meta_path} {section}")
        seen["metadata files"] += 1
        for state in sorted(meta_path.parent.glob("*.state")):
            payload = decode_task_state(state.read_bytes(), key, str(state), allow_pickle=False)
            _walk(payload, seen, str(state))
            seen["state files"] += 1
    assert seen["metadata files"], f"no completed checkpoint under {storage}"
    return seen


def _walk(value: Any, seen: collections.Counter[str], where: str) -> None:
    if isinstance(value, bytes):
        assert not value.startswith(b"\x80"), f"{where}: a pickle ({value[:16]!r})"
        if value.startswith(_IPC):
            pa.ipc.open_stream(value).read_all()
            seen["arrow ipc values"] += 1
        else:
            json.loads(value)  # what a JSON serializer wrote
            seen["json values"] += 1
    elif isinstance(value, dict):
        for k, v in value.items():
            _walk(k, seen, where)
            _walk(v, seen, where)
    elif isinstance(value, list | tuple):
        for v in value:
            _walk(v, seen, where)
