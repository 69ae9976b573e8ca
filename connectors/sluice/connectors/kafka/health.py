"""Whether a reader's consumer reaches a Kafka broker: what an outage looks like to the reader.

librdkafka retries a lost broker forever, so an outage is otherwise a reader that just reads nothing.
:class:`BrokerHealth` follows the consumer's view: its statistics (once a second: each broker
connection's state) and its error callback (``_ALL_BROKERS_DOWN``, and ``_TRANSPORT`` / ``_RESOLVE`` /
authentication errors, whose text says why). The brokers are *unreachable* from the first sign that no
connection is up until a statistics report shows one up or records arrive again. The reader reports an
outage that lasted :data:`GRACE_S` as stalled (``ctx.stalled``, with when it began and the last error)
and, once it lasted ``broker_unavailable_timeout_s``, fails over to a restart.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError
from sluice.connectors.kafka.errors import KafkaSourceError
from sluice.connectors.kafka.options import KafkaSourceOptions
from sluice.source import ReaderContext

__all__ = ["GRACE_S", "BrokerHealth", "OutageGuard"]

log = logging.getLogger("sluice.kafka")

#: an outage shorter than this is not reported (a reconnect between two statistics reports)
GRACE_S = 2.0

_WHY_CODES = {
    KafkaError._TRANSPORT,
    KafkaError._RESOLVE,
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError.SASL_AUTHENTICATION_FAILED,
}


#: librdkafka's prefix naming the connection (``host:port/id: ``, ``GroupCoordinator: ``) and its suffix
#: timing the attempt: the reason stays the same from one reconnect to the next without them
_CONNECTION = re.compile(r"^(GroupCoordinator: )?(\S+/\w+: |\S+:\d+: )?|\s*\(after \d+ms in state \w+\)$")


def _clean(text: str) -> str:
    return _CONNECTION.sub("", text).strip()


class BrokerHealth:
    """One consumer's broker reachability (thread-safe: librdkafka calls back on the thread that polls).

    Args:
        clock: monotonic seconds (tests pass their own).
        wall: epoch seconds, for the time an outage began as shown to people.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._down_since: tuple[float, float] | None = None  # (monotonic, wall)
        self._why = ""

    # -- what librdkafka says --------------------------------------------------------------------------
    def on_error(self, err: KafkaError) -> None:
        """An error callback: connection-level errors say why; "all brokers down" marks an outage."""
        code = err.code()
        if code not in _WHY_CODES:
            return
        with self._lock:
            if code != KafkaError._ALL_BROKERS_DOWN or not self._why:
                self._why = _clean(err.str())
            if code == KafkaError._ALL_BROKERS_DOWN:
                self._down()

    def on_stats(self, brokers: Mapping[str, Any] | None) -> None:
        """A statistics report's ``brokers``: up if any connection is up."""
        if not brokers:
            return
        up = any(isinstance(b, Mapping) and b.get("state") == "UP" for b in brokers.values())
        with self._lock:
            if up:
                self._up()
            else:
                self._down()

    def on_records(self) -> None:
        """Records arrived: a broker answered."""
        if self._down_since is not None:
            with self._lock:
                self._up()

    def _down(self) -> None:
        if self._down_since is None:
            self._down_since = (self._clock(), self._wall())

    def _up(self) -> None:
        self._down_since = None
        self._why = ""

    # -- what the reader asks --------------------------------------------------------------------------
    @property
    def down(self) -> bool:
        """No connection to any broker is up now (however briefly)."""
        return self._down_since is not None

    def outage(self) -> tuple[float, float, str] | None:
        """``(seconds so far, epoch seconds it began, why)`` of an outage that lasted :data:`GRACE_S`."""
        with self._lock:
            down, why = self._down_since, self._why
        if down is None:
            return None
        lasted = self._clock() - down[0]
        if lasted < GRACE_S:
            return None
        return lasted, down[1], why or "no connection to any broker is up"


class OutageGuard:
    """A reader's broker outages as the job sees them: reported as stalled (``ctx.stalled``, and the log)
    once they lasted :data:`GRACE_S`, failed over to a restart once they lasted the source's
    ``broker_unavailable_timeout_s``.

    Args:
        options: the source's options (its servers, name and timeout).
        ctx: the reader's context.
    """

    def __init__(self, options: KafkaSourceOptions, ctx: ReaderContext) -> None:
        self.options = options
        self.ctx = ctx
        #: what the consumer's callbacks feed
        self.health = BrokerHealth()
        self._stall: str | None = None

    def check(self) -> None:
        """Report an outage as stalled; raise a recoverable KafkaSourceError once it lasted the timeout."""
        outage = self.health.outage()
        if outage is None:
            self.report(None)
            return
        lasted, since, why = outage
        src = self.options
        self.report(f"no Kafka broker reachable at {src.bootstrap_servers}: {why}")
        timeout = src.broker_unavailable_timeout_s
        if timeout is not None and lasted >= timeout:
            raise KafkaSourceError(
                f"KafkaSource {src.name!r}: no Kafka broker at {src.bootstrap_servers!r} reachable for "
                f"{lasted:.0f}s (since {time.strftime('%H:%M:%S', time.localtime(since))}): {why}. Failing "
                f"over to a restart (broker_unavailable_timeout_s={timeout}); check the brokers and the "
                "network between them and this reader.",
                recoverable=True,
            )

    def report(self, reason: str | None) -> None:
        """Say the reader is stalled for ``reason``, or (None) that it is not, when that changes."""
        if reason == self._stall:
            return
        name, subtask = self.options.name, self.ctx.subtask
        if reason is not None and self._stall is None:
            log.warning("%s[%d]: stalled: %s", name, subtask, reason)
        elif reason is None:
            log.warning("%s[%d]: a broker is reachable again, reading on", name, subtask)
        self._stall = reason
        stalled = getattr(self.ctx, "stalled", None)  # contexts written before ReaderContext.stalled
        if stalled is not None:
            stalled(reason)
