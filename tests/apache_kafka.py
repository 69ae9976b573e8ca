"""A real Apache Kafka broker for the tests: one KRaft node (broker and controller) as a JVM on loopback.

Its jars are resolved by Maven once per machine (tests/apache_kafka_jars.py; ``.ci/run`` does it, and so does
the first start where the cache is missing); its storage is formatted by Kafka's own ``StorageTool`` in a
temporary folder. Nothing is skipped: a missing Java or Maven fails with one line saying how to get them.

Known Apache Kafka behaviour the tests must allow for: after a hard kill (:meth:`ApacheKafkaBroker.kill`)
of this single node, a transaction whose commit or abort markers were not all written yet may be left
hanging (see ``kill``).

Usage (the helpers are :class:`tests.kafka_test_broker.KafkaTestBroker`'s, shared with tansu)::

    with ApacheKafkaBroker() as broker:
        broker.create_topic("t", partitions=2)
        broker.produce("t", [b"a", b"b"], partition=0)
        assert [r.value for r in broker.read_committed("t")] == [b"a", b"b"]
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.apache_kafka_jars import (
    KAFKA_VERSION,
    ApacheKafkaUnavailableError,
    class_archive,
    find_java,
    kafka_classpath,
    main,
)
from tests.kafka_test_broker import KafkaTestBroker

__all__ = ["COMPACTED_TOPIC", "KAFKA_VERSION", "ApacheKafkaBroker", "ApacheKafkaUnavailableError", "kafka_classpath"]

#: topic settings under which the log cleaner compacts within about a second: a segment rolls at the first
#: append 100 ms after it opened (the active segment is never cleaned, so a test appends once more after
#: the records it wants compacted), any dirty share makes the log cleanable, tombstones go at the next pass
COMPACTED_TOPIC: Mapping[str, str] = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.001",
    "delete.retention.ms": "0",
    "min.compaction.lag.ms": "0",
}

_BROKER_CONFIG = """\
process.roles=broker,controller
node.id=1
controller.listener.names=CONTROLLER
inter.broker.listener.name=INTERNAL
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
min.insync.replicas=1
group.initial.rebalance.delay.ms=0
log.cleaner.enable=true
log.cleaner.threads=1
log.cleaner.backoff.ms=100
log.cleaner.dedupe.buffer.size=16777216
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=6000
"""

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = ${sys:sluice.log.level:-INFO}
rootLogger.appenderRef.out.ref = OUT
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""

#: JVM options of the broker: a small heap, serial GC, and C1 only: on 2 loaded cores it starts in about
#: half the time and, over a test-sized load (800k records, 40 transactions), spent 2.8 s of JVM CPU
#: against 5.1 s with C2, whose compilations never paid back
JVM_OPTIONS: tuple[str, ...] = (
    "-Xms256m", "-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
)  # fmt: skip


def _free_ports(n: int, exclude: int | None = None) -> list[int]:
    """``n`` distinct free loopback ports, none equal to ``exclude``. The sockets stay bound until all are
    chosen: a port closed before the next is asked for can come back at once (CI once got one port for
    two listeners)."""
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket()
            sockets.append(s)  # an excluded port stays bound too, so that it is not offered again
            s.bind(("127.0.0.1", 0))
            if (port := int(s.getsockname()[1])) != exclude:
                ports.append(port)
        return ports
    finally:
        for s in sockets:
            s.close()


def _cluster_id() -> str:
    """A random cluster id as Kafka writes one (base64url of 16 bytes; Kafka never starts one with '-')."""
    while True:
        cid = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class _EarlyExit(RuntimeError):
    """The JVM exited during startup."""


class ApacheKafkaBroker(KafkaTestBroker):
    """A single-node KRaft Apache Kafka on loopback at free ports, its data in a temporary folder.

    ``start()`` formats the storage and launches the JVM (a few seconds); ``kill()`` crashes the broker
    (SIGKILL) and keeps its data and ports, ``start()`` then brings it back; ``restart()`` does both;
    ``stop()`` ends it and removes the folder.

    Args:
        startup_timeout: seconds to wait until it serves (a loaded 2-core machine may need a minute).
        config: broker settings added to (or overriding) the fixture's.
        jvm_options: options of the JVM (default :data:`JVM_OPTIONS`).
    """

    #: the port the broker tells clients to connect to, if not its own (a test's fault proxy in front of it);
    #: the broker's own traffic to itself (e.g. transaction markers) uses a listener of its own, never this
    advertised_port: int | None = None
    #: the clients' port (None: a free one); ``python -m tests.apache_kafka --serve`` sets it
    port: int | None = None

    def __init__(
        self,
        startup_timeout: float = 180.0,
        config: Mapping[str, str] | None = None,
        jvm_options: tuple[str, ...] = JVM_OPTIONS,
    ) -> None:
        self.startup_timeout = startup_timeout
        self.config = dict(config or {})
        self.jvm_options = jvm_options
        self._dir: Path | None = None
        self._ports: tuple[int, int, int] | None = None  # clients, internal, controller
        self._proc: subprocess.Popen[bytes] | None = None
        self._admin: AdminClient | None = None
        self._archive: tuple[Path, Path] | None = None  # (being dumped, final) class archive
        self._owner = os.getpid()

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``; only valid after ``start()``."""
        if self._ports is None:
            raise RuntimeError("ApacheKafkaBroker is not started")
        return f"127.0.0.1:{self._ports[0]}"

    @property
    def internal_bootstrap(self) -> str:
        """The broker's own listener, which never advertises :attr:`advertised_port`: the way of the helpers
        (``admin``, ``produce``, ``read_committed``...) and of a test's own clients around a fault proxy in
        front of :attr:`bootstrap`."""
        if self._ports is None:
            raise RuntimeError("ApacheKafkaBroker is not started")
        return f"127.0.0.1:{self._ports[1]}"

    _tools_bootstrap = internal_bootstrap

    @property
    def admin(self) -> AdminClient:
        """A shared AdminClient bound to this broker."""
        if self._admin is None:
            raise RuntimeError("ApacheKafkaBroker is not running")
        return self._admin

    @property
    def log_path(self) -> Path:
        """The broker's log (its stdout and stderr, across restarts)."""
        if self._dir is None:
            raise RuntimeError("ApacheKafkaBroker is not started")
        return self._dir / "broker.log"

    @property
    def data_dir(self) -> Path:
        """The broker's ``log.dirs`` (partitions and the metadata log)."""
        if self._dir is None:
            raise RuntimeError("ApacheKafkaBroker is not started")
        return self._dir / "data"

    @property
    def running(self) -> bool:
        """Whether the JVM is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> ApacheKafkaBroker:
        """Launch the broker and block until it serves every partition it holds; after ``kill()`` on the
        same ports and data, else in a fresh folder with freshly formatted storage.

        A fresh start whose JVM exits because a port was taken in the meantime is retried twice on new
        ports. On failure the error carries the tail of the broker's log.

        Raises:
            ApacheKafkaUnavailableError: no Java, or no jars and no Maven to resolve them.
            RuntimeError: the broker exits or is not ready within ``startup_timeout``.
        """
        if self._proc is not None:
            raise RuntimeError("ApacheKafkaBroker already running")
        java, classpath = find_java(), kafka_classpath()
        if self._dir is not None:
            self._launch(java, classpath)
            return self
        for attempt in range(3):
            self._dir = Path(tempfile.mkdtemp(prefix="apache-kafka-"))
            client, internal, controller = _free_ports(3, exclude=self.port)
            self._ports = (self.port or client, internal, controller)
            try:
                self._format(java, classpath)
                self._launch(java, classpath)
                return self
            except _EarlyExit:
                port_taken = "Address already in use" in self.log_path.read_text(errors="replace")
                self.stop()
                if not port_taken or attempt == 2:
                    raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _write_config(self) -> Path:
        assert self._dir is not None and self._ports is not None
        client, internal, controller = self._ports
        settings = {
            "listeners": f"PLAINTEXT://127.0.0.1:{client},INTERNAL://127.0.0.1:{internal},"
            f"CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.advertised_port or client},"
            f"INTERNAL://127.0.0.1:{internal}",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller}",
            "log.dirs": str(self.data_dir),
            **self.config,
        }
        path = self._dir / "server.properties"
        path.write_text(_BROKER_CONFIG + "".join(f"{k}={v}\n" for k, v in settings.items()))
        (self._dir / "log4j2.properties").write_text(_LOG4J2)
        return path

    def _java(self, java: str, classpath: str, options: tuple[str, ...], *args: str) -> list[str]:
        assert self._dir is not None
        return [java, *options, f"-Dlog4j2.configurationFile={self._dir / 'log4j2.properties'}", "-cp", classpath, *args]

    def _format(self, java: str, classpath: str) -> None:
        """Format the storage with Kafka's StorageTool, as a single-voter (standalone) controller quorum."""
        archive = class_archive(java, classpath)
        cds = (f"-XX:SharedArchiveFile={archive}",) if archive.is_file() else ()
        cmd = self._java(java, classpath, ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                                           "-Dsluice.log.level=WARN", *cds),
                         "kafka.tools.StorageTool", "format", "--standalone", "-t", _cluster_id(),
                         "-c", str(self._write_config()))  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=self.startup_timeout, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"Kafka's StorageTool format failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")

    def _launch(self, java: str, classpath: str) -> None:
        config = self._write_config()
        archive = class_archive(java, classpath)
        if archive.is_file():
            cds = f"-XX:SharedArchiveFile={archive}"
        else:
            self._archive = (archive.with_suffix(f".{os.getpid()}.tmp"), archive)
            cds = f"-XX:ArchiveClassesAtExit={self._archive[0]}"
        cmd = self._java(java, classpath, (*self.jvm_options, cds), "kafka.Kafka", str(config))
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._owner = os.getpid()
        atexit.register(self._at_exit)
        try:
            self._wait_ready()
        except BaseException:
            self._kill_jvm()
            raise

    def _wait_ready(self) -> None:
        """Block until the broker serves every partition it holds: after a restart, leadership and log
        recovery go on for a while after its ports open and its metadata answers."""
        assert self._proc is not None and self._ports is not None
        deadline = time.monotonic() + self.startup_timeout
        probe: Consumer | None = None
        last: object = "its port never accepted a connection"
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise _EarlyExit(f"Apache Kafka exited with code {self._proc.returncode} during startup\n{self.log_tail()}")
                if probe is None:  # until the port listens: librdkafka would back off for seconds after refusals
                    with socket.socket() as s:
                        if s.connect_ex(("127.0.0.1", self._ports[1])) == 0:
                            probe = Consumer({"bootstrap.servers": self.internal_bootstrap, "group.id": "sluice-tests-probe",
                                              "isolation.level": "read_uncommitted", "log_level": 0})  # fmt: skip
                else:
                    try:
                        md = probe.list_topics(timeout=2.0)
                        if md.brokers:
                            for t in md.topics.values():
                                for p in t.partitions:
                                    probe.get_watermark_offsets(TopicPartition(t.topic, p), timeout=2.0)
                            self._admin = AdminClient({"bootstrap.servers": self.internal_bootstrap, "log_level": 0})
                            return
                    except KafkaException as exc:
                        last = exc
                time.sleep(0.05)
        finally:
            if probe is not None:
                probe.close()
        raise RuntimeError(
            f"Apache Kafka on {self.bootstrap} not ready after {self.startup_timeout}s ({last})\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the broker's log, with a header naming the file."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except (OSError, RuntimeError) as exc:
            return f"<no broker log: {exc}>"
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text[-lines:])

    def cleaned_offsets(self, topic: str) -> dict[int, int]:
        """``{partition: offset}`` up to which the log cleaner has compacted ``topic`` (its checkpoint file;
        partitions never cleaned are absent)."""
        try:
            lines = (self.data_dir / "cleaner-offset-checkpoint").read_text().splitlines()[2:]
        except FileNotFoundError:
            return {}
        return {int(p): int(o) for t, p, o in (line.split() for line in lines) if t == topic}

    def _at_exit(self) -> None:
        if os.getpid() == self._owner:  # not in a forked child, whose exit must leave the broker alone
            self._kill_jvm()

    def _kill_jvm(self, graceful: float = 0.0) -> None:
        """End the JVM: SIGTERM and up to ``graceful`` seconds for a clean shutdown, then SIGKILL."""
        proc, self._proc = self._proc, None
        archive, self._archive = self._archive, None
        self._admin = None
        atexit.unregister(self._at_exit)
        if proc is not None and proc.poll() is None and graceful > 0:
            proc.terminate()
            try:
                proc.wait(timeout=graceful)
            except subprocess.TimeoutExpired:
                pass
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if archive is not None:  # written by a JVM that exits on its own (a killed one may leave half)
            dumped, final = archive
            if proc is not None and proc.returncode >= 0 and dumped.is_file() and dumped.stat().st_size > 0:
                os.replace(dumped, final)
            dumped.unlink(missing_ok=True)

    def kill(self) -> None:
        """Crash the broker (SIGKILL); its data and ports stay for ``start()``.

        Apache Kafka's own behaviour after such a crash of its only node (seen on 4.3.1 with librdkafka's
        transactions): the restarted controller keeps the dead incarnation's registration until its session
        times out (``broker.session.timeout.ms``, 6 s here), then fences it and re-elects every partition's
        leader (an "unclean" election from the last known ELR). A transaction coordinator that resumes a
        commit or an abort inside that window skips the markers of partitions without a leader ("likely
        deleted already"), so that transaction hangs: the partition's last stable offset stays below it and
        ``read_committed`` readers stop there. A test that must not meet it crashes the broker once
        :meth:`stable_offsets` equals :meth:`end_offsets`, or uses :meth:`restart`, a clean shutdown.
        """
        self._kill_jvm()

    def restart(self, hard: bool = False) -> ApacheKafkaBroker:
        """Stop the broker (SIGKILL if ``hard``, else a clean shutdown) and start it on the same ports and
        data."""
        self._kill_jvm(graceful=0.0 if hard else 60.0)
        return self.start()

    def stop(self) -> None:
        """Terminate the broker (SIGTERM, SIGKILL after 10 s, or 120 s while the JVM writes the class archive:
        once per machine) and remove its folder; idempotent."""
        self._kill_jvm(graceful=10.0 if self._archive is None else 120.0)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = self._ports = None

    def __enter__(self) -> ApacheKafkaBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def serve(port: int) -> None:
    """``python -m tests.apache_kafka --serve [--port 9092]``: an Apache Kafka on 127.0.0.1:PORT for trying
    jobs and templates by hand, until Ctrl-C (or SIGTERM); its data is discarded then."""
    import signal

    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise SystemExit(f"port {port} is taken (another broker?): give another one with --port N")
    broker = ApacheKafkaBroker()
    broker.port = port
    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    print(f"starting Apache Kafka {KAFKA_VERSION} (one KRaft node) on 127.0.0.1:{port} ...", flush=True)
    with broker:
        print(f"serving: KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{port}  (log: {broker.log_path}; Ctrl-C stops it)",
              flush=True)
        try:
            while broker.running:
                time.sleep(0.5)
            raise SystemExit(f"the broker exited\n{broker.log_tail()}")
        except KeyboardInterrupt:
            print("stopping", flush=True)


if __name__ == "__main__":
    import sys

    if "--serve" in sys.argv[1:]:
        import argparse

        parser = argparse.ArgumentParser(prog="python -m tests.apache_kafka", description=serve.__doc__)
        parser.add_argument("--serve", action="store_true", help="run a broker until Ctrl-C")
        parser.add_argument("--port", type=int, default=9092, help="the clients' port (default 9092)")
        serve(parser.parse_args().port)
    else:
        main()
