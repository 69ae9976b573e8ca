"""Debezium change events and keyed records as Debezium's converters and Kafka producers write them."""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "DBZ_ENVELOPE",
    "DBZ_KEY",
    "USER",
    "USER_KEY",
    "connect_json",
    "event",
    "json_key",
]

#: Debezium's Avro key schema of table inventory.customers (its primary key)
DBZ_KEY: dict[str, Any] = {
    "type": "record",
    "name": "Key",
    "namespace": "dbserver1.inventory.customers",
    "fields": [{"name": "id", "type": "int"}],
}
_VALUE: dict[str, Any] = {
    "type": "record",
    "name": "Value",
    "namespace": "dbserver1.inventory.customers",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None},
    ],
}
_SOURCE: dict[str, Any] = {
    "type": "record",
    "name": "Source",
    "namespace": "io.debezium.connector.postgresql",
    "fields": [
        {"name": "version", "type": "string"},
        {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "ts_ms", "type": "long"},
        {"name": "db", "type": "string"},
        {"name": "schema", "type": "string"},
        {"name": "table", "type": "string"},
        {"name": "lsn", "type": ["null", "long"], "default": None},
    ],
}
#: Debezium's Avro envelope of inventory.customers (``after`` refers to the named type ``Value``)
DBZ_ENVELOPE: dict[str, Any] = {
    "type": "record",
    "name": "Envelope",
    "namespace": "dbserver1.inventory.customers",
    "fields": [
        {"name": "before", "type": ["null", _VALUE], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": _SOURCE},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
        {
            "name": "transaction",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "block",
                    "namespace": "event",
                    "fields": [
                        {"name": "id", "type": "string"},
                        {"name": "total_order", "type": "long"},
                        {"name": "data_collection_order", "type": "long"},
                    ],
                },
            ],
            "default": None,
        },
    ],
}
#: a keyed topic's Avro key and value schemas
USER_KEY: dict[str, Any] = {"type": "record", "name": "UserKey", "namespace": "shop", "fields": [{"name": "user_id", "type": "long"}]}
USER: dict[str, Any] = {
    "type": "record",
    "name": "User",
    "namespace": "shop",
    "fields": [{"name": "name", "type": "string"}, {"name": "score", "type": "double"}],
}

#: the Kafka Connect schema of the customers envelope (what JsonConverter writes with schemas.enable=true)
_CONNECT_ROW = {
    "type": "struct",
    "optional": True,
    "name": "dbserver1.inventory.customers.Value",
    "fields": [
        {"type": "int32", "optional": False, "default": 0, "field": "id"},
        {"type": "string", "optional": False, "field": "name"},
        {"type": "string", "optional": True, "default": "n/a", "field": "email"},
    ],
}
_CONNECT_ENVELOPE = {
    "type": "struct",
    "optional": False,
    "name": "dbserver1.inventory.customers.Envelope",
    "version": 1,
    "fields": [
        {**_CONNECT_ROW, "field": "before"},
        {**_CONNECT_ROW, "field": "after"},
        {
            "type": "struct",
            "optional": False,
            "name": "io.debezium.connector.postgresql.Source",
            "field": "source",
            "fields": [
                {"type": "string", "optional": False, "field": "version"},
                {"type": "string", "optional": False, "field": "table"},
                {"type": "int64", "optional": True, "field": "lsn"},
                {"type": "string", "optional": True, "default": "false", "field": "snapshot",
                 "name": "io.debezium.data.Enum", "parameters": {"allowed": "true,last,false,incremental"}},
            ],
        },
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
}


def event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, *, lsn: int = 0) -> dict[str, Any]:
    """A Debezium change event of inventory.customers."""
    source = {
        "version": "2.5.0.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": 1_700_000_000_000,
        "db": "inventory", "schema": "public", "table": "customers", "lsn": lsn,
    }
    return {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1_700_000_000_000 + lsn, "transaction": None}


def connect_json(payload: Any, *, key: bool = False) -> bytes:
    """``payload`` in JsonConverter's schema envelope (``schemas.enable=true``)."""
    schema = (
        {"type": "struct", "optional": False, "name": "dbserver1.inventory.customers.Key",
         "fields": [{"type": "int32", "optional": False, "field": "id"}]}
        if key
        else _CONNECT_ENVELOPE
    )
    return json.dumps({"schema": schema, "payload": payload}).encode()


def json_key(id_: int, *, schema: bool = False) -> bytes:
    """Debezium's JSON message key of row ``id_``."""
    return connect_json({"id": id_}, key=True) if schema else json.dumps({"id": id_}).encode()
