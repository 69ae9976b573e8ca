"""Signing checkpoint files: HMAC-SHA256 with the job's checkpoint key, and the key's public name.

Where the key comes from (the option, ``$SLUICE_CHECKPOINT_KEY``, the user's key file) is
:mod:`sluice.config.checkpoint_key`.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["key_id", "mac"]

_KEY_ID_CONTEXT = b"sluice checkpoint key id"


def key_id(key: bytes) -> str:
    """A short public name of ``key`` (it reveals nothing of it): says which key signed a file."""
    return hmac.new(key, _KEY_ID_CONTEXT, hashlib.sha256).hexdigest()[:12]


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of ``parts`` (each length-prefixed, so parts cannot be shifted into each other)."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.digest()
