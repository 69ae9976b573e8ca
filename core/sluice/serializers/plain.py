"""Plain data as JSON: the value encoding of checkpoint files (and of the built-in connectors' serializers).

Plain data is ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list``, ``tuple``, ``dict`` (any
plain keys), ``datetime.date`` / ``datetime`` / ``time``, ``Decimal`` and ``UUID``, by exact type (a subclass such as a
namedtuple or an enum is not plain: it would come back as its base type). JSON holds what it can
directly; everything else becomes a *tag*, an object ``{"$": <type>, "v": <value>}``:

==========  ==========================================  =============================================
tag         value                                       for
==========  ==========================================  =============================================
``tuple``   list of encoded items                       tuples
``map``     list of ``[key, value]`` pairs              dicts with a non-string key (or a ``"$"`` key)
``b64``     base64 text                                 bytes, inline (``_metadata``, serializers)
``bytes``   section number                              bytes, as a raw section of a task state file
``pickle``  section number                              user values that are not plain (task state only)
``float``   ``"nan"``, ``"inf"``, ``"-inf"``            non-finite floats (the JSON stays strict)
``date``    ISO text (also ``datetime``, ``time``)      dates and times (offsets and IANA zones kept)
``decimal`` text                                        ``Decimal``
``uuid``    text                                        ``UUID``
==========  ==========================================  =============================================

Decoding is strict: an object with a ``"$"`` key must be a known tag of exactly that shape, or the data is
refused (:class:`PlainFormatError`). Decoding never runs code: ``pickle`` sections are handed to a callback
that the task-state container gives only after the file's HMAC was verified.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import math
import uuid
import zoneinfo
from collections.abc import Callable
from typing import Any

__all__ = ["NotPlainError", "PlainFormatError", "decode", "encode"]

_SCALARS = (str, int, bool, type(None))
_TAGS = {datetime.date: "date", datetime.time: "time", decimal.Decimal: "decimal", uuid.UUID: "uuid"}


class NotPlainError(TypeError):
    """A value is not plain data (and the encoder has no fallback for it)."""


class PlainFormatError(ValueError):
    """Encoded data is not valid plain data (an unknown tag, a malformed value)."""


def encode(
    value: Any,
    put_bytes: Callable[[bytes], Any] | None = None,
    fallback: Callable[[Any], Any] | None = None,
) -> Any:
    """``value`` as a JSON-ready tree.

    Args:
        value: Plain data.
        put_bytes: Stores a bytes value and returns its tag (``{"$": "bytes", "v": n}``); None: inline base64.
        fallback: Encodes a value that is not plain (returns its tag); None: raise :class:`NotPlainError`.
    """
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"$": "float", "v": repr(value)}
    if kind is list:
        return [encode(v, put_bytes, fallback) for v in value]
    if kind is tuple:
        return {"$": "tuple", "v": [encode(v, put_bytes, fallback) for v in value]}
    if kind is dict:
        if all(type(k) is str for k in value) and "$" not in value:
            return {k: encode(v, put_bytes, fallback) for k, v in value.items()}
        return {
            "$": "map",
            "v": [[encode(k, put_bytes, fallback), encode(v, put_bytes, fallback)] for k, v in value.items()],
        }
    if kind is bytes:
        return put_bytes(value) if put_bytes is not None else {"$": "b64", "v": base64.b64encode(value).decode()}
    if kind is datetime.datetime:
        zone = value.tzinfo.key if isinstance(value.tzinfo, zoneinfo.ZoneInfo) else None
        return {"$": "datetime", "v": value.isoformat() + (f"[{zone}]" if zone else "")}
    if kind in (datetime.date, datetime.time, decimal.Decimal, uuid.UUID):
        return {"$": _TAGS[kind], "v": value.isoformat() if kind in (datetime.date, datetime.time) else str(value)}
    if fallback is not None:
        return fallback(value)
    raise NotPlainError(f"{type(value).__name__} is not plain data")


def decode(
    tree: Any,
    get_bytes: Callable[[int], bytes] | None = None,
    get_pickle: Callable[[int], Any] | None = None,
) -> Any:
    """Inverse of :func:`encode`; raises :class:`PlainFormatError` on anything it did not write.

    Args:
        tree: The JSON-decoded tree.
        get_bytes: The raw section ``n`` (task state files); None: ``bytes`` tags are refused.
        get_pickle: The value of pickle section ``n``; None: ``pickle`` tags are refused.
    """
    if type(tree) in _SCALARS or type(tree) is float:
        return tree
    if isinstance(tree, list):
        return [decode(v, get_bytes, get_pickle) for v in tree]
    if not isinstance(tree, dict):
        raise PlainFormatError(f"unexpected {type(tree).__name__}")
    if "$" not in tree:
        return {k: decode(v, get_bytes, get_pickle) for k, v in tree.items()}
    if set(tree) != {"$", "v"}:
        raise PlainFormatError(f"malformed tag {sorted(tree)}")
    tag, v = tree["$"], tree["v"]
    try:
        return _decode_tag(tag, v, get_bytes, get_pickle)
    except (ValueError, TypeError, decimal.InvalidOperation, binascii.Error, zoneinfo.ZoneInfoNotFoundError) as exc:
        if isinstance(exc, PlainFormatError):
            raise
        raise PlainFormatError(f"bad {tag!r} value: {exc}") from exc


def _decode_tag(
    tag: Any, v: Any, get_bytes: Callable[[int], bytes] | None, get_pickle: Callable[[int], Any] | None
) -> Any:
    if tag == "tuple":
        return tuple(decode(x, get_bytes, get_pickle) for x in _list(v))
    if tag == "map":
        out = {}
        for pair in _list(v):
            if not isinstance(pair, list) or len(pair) != 2:
                raise PlainFormatError("a map entry is not a [key, value] pair")
            out[decode(pair[0], get_bytes, get_pickle)] = decode(pair[1], get_bytes, get_pickle)
        return out
    if tag == "b64":
        return base64.b64decode(_str(v), validate=True)
    if tag in ("bytes", "pickle"):
        get = get_bytes if tag == "bytes" else get_pickle
        if get is None or not isinstance(v, int) or isinstance(v, bool):
            raise PlainFormatError(f"{tag!r} sections are not allowed here")
        return get(v)
    if tag == "float":
        if v not in ("nan", "inf", "-inf"):
            raise PlainFormatError(f"bad float {v!r}")
        return float(v)
    parse: dict[str, Callable[[str], Any]] = {
        "date": datetime.date.fromisoformat,
        "datetime": _datetime,
        "time": datetime.time.fromisoformat,
        "decimal": decimal.Decimal,
        "uuid": uuid.UUID,
    }
    if tag in parse:
        return parse[tag](_str(v))
    raise PlainFormatError(f"unknown tag {tag!r}")


def _list(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise PlainFormatError("expected a list")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise PlainFormatError("expected a string")
    return v


def _datetime(text: str) -> datetime.datetime:
    if text.endswith("]"):  # an IANA zone after the offset (RFC 9557)
        text, _, zone = text[:-1].partition("[")
        return datetime.datetime.fromisoformat(text).astimezone(zoneinfo.ZoneInfo(zone))
    return datetime.datetime.fromisoformat(text)
