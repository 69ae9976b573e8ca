"""A Confluent Schema Registry stand-in for tests: serves recorded REST exchanges on loopback.

No registry server can be installed here (Karapace is not on PyPI; Confluent's is a JVM service outside
the package registries; see docs/kafka.md), so the fixture replays ``registry_recordings.json``: each
exchange is a request (method, path, JSON body) and the registry's answer (status, content type, JSON
body). A request that matches no exchange gets HTTP 500 and is remembered, and the fixture fails the test
at teardown: a test can only rely on answers the registry gives.

Usage::

    with RecordedSchemaRegistry() as reg:
        sid = reg.register("orders-value", ORDER_V1)       # POST /subjects/orders-value/versions
        value = avro_wire(sid, ORDER_V1, {"id": 1, ...})   # magic byte, id, Avro payload
        reg.requests["GET /schemas/ids/1"]                 # how often a path was asked for
"""

from __future__ import annotations

import collections
import io
import json
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import fastavro

__all__ = ["RECORDINGS", "RecordedSchemaRegistry", "avro_wire", "json_wire"]

RECORDINGS = Path(__file__).with_name("registry_recordings.json")


def _key(method: str, path: str, body: Any) -> str:
    return f"{method} {path} {json.dumps(body, sort_keys=True) if body is not None else ''}".strip()


class RecordedSchemaRegistry:
    """Replays recorded registry exchanges over HTTP on 127.0.0.1 (a random port)."""

    def __init__(self, recordings: Path = RECORDINGS) -> None:
        doc = json.loads(recordings.read_text())
        self.exchanges: dict[str, dict[str, Any]] = {}
        for ex in doc["exchanges"]:
            req = ex["request"]
            self.exchanges[_key(req["method"], req["path"], req.get("body"))] = ex["response"]
        #: "METHOD /path" -> number of requests
        self.requests: collections.Counter[str] = collections.Counter()
        #: requests no recording answers (a test that causes one fails at teardown)
        self.unmatched: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> RecordedSchemaRegistry:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                path = self.path.split("?", 1)[0]
                registry.requests[f"{self.command} {path}"] += 1
                resp = registry.exchanges.get(_key(self.command, path, body))
                if resp is None:
                    registry.unmatched.append(_key(self.command, path, body))
                    status, ctype, out = 500, "application/json", {"error_code": 50001, "message": "not recorded"}
                else:
                    status, ctype, out = resp["status"], resp["content_type"], resp["body"]
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="registry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> RecordedSchemaRegistry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the calls a producer's serializer makes ----------------------------------------------------------
    def _call(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            method=method,
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def register(self, subject: str, schema: dict[str, Any], schema_type: str = "AVRO") -> int:
        """Register ``schema`` under ``subject`` (as a serializer does) and return its id."""
        body: dict[str, Any] = {"schema": json.dumps(schema, separators=(",", ":"))}
        if schema_type != "AVRO":
            body = {"schemaType": schema_type, **body}
        status, answer = self._call("POST", f"/subjects/{subject}/versions", body)
        if status != 200:
            raise RuntimeError(f"registry refused the schema (HTTP {status}): {answer['message']}")
        return int(answer["id"])

    def set_compatibility(self, subject: str, level: str) -> None:
        status, answer = self._call("PUT", f"/config/{subject}", {"compatibility": level})
        assert status == 200, answer


def avro_wire(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """``record`` as Confluent's Avro serializer writes it: 0x00, the id (big-endian), the Avro binary."""
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def json_wire(schema_id: int, record: dict[str, Any]) -> bytes:
    """``record`` as Confluent's JSON Schema serializer writes it: 0x00, the id, the JSON text."""
    return struct.pack(">bI", 0, schema_id) + json.dumps(record).encode()
