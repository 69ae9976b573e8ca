"""The driver's end of the Spark runtime's control plane: a TCP server that slots report to.

:class:`ControlServer` accepts authenticated slot connections for one attempt, turns their reports into
:class:`~sluice.runtime.job.JobAttempt` calls (acknowledge, decline, end_of_input, finished, failed,
request_split), re-emits their log records, and sends the coordinator's notifications through
:class:`RemoteTaskHandle` proxies. Messages of another attempt are dropped; a slot connection that breaks
while the attempt runs fails the attempt at once (sooner than Spark notices).
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from sluice.errors import SluiceError
from sluice.events import CheckpointBarrier
from sluice.graph import SubtaskId
from sluice.runtime.attempt import JobAttempt
from sluice.runtime.fault_hook import NO_FAULTS, FaultHook
from sluice.runtime.spark import rpc
from sluice.source import SourceSplit

__all__ = ["ControlServer", "RemoteTaskHandle", "SlotLostError"]

log = logging.getLogger("sluice.spark")


class SlotLostError(SluiceError):
    """A slot's connection to the driver broke while the attempt was running (crash, lost executor)."""


@dataclass
class _Metrics:
    metrics: dict[str, int] = field(default_factory=dict)


class RemoteTaskHandle:
    """The coordinator's and the enumerators' handle on a subtask that runs in a slot (a TaskHandle)."""

    def __init__(self, task: SubtaskId, server: ControlServer) -> None:
        self.id = task
        self._server = server
        self.name = str(task)
        #: operator metrics reported by the slot (``run_job`` sums ``contexts[*].metrics``)
        self.contexts: list[_Metrics] = [_Metrics()]

    def _send(self, op: str, *args: Any) -> None:
        self._server.send_to_slot(self.id.index, (op, self.id, *args))

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None:
        self._send("trigger", barrier)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._send("complete", checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._send("aborted", checkpoint_id)

    def assign_splits(self, splits: list[SourceSplit]) -> None:
        self._send("assign", splits)

    def no_more_splits(self) -> None:
        self._send("no_more_splits")


class ControlServer:
    """Serves the slots of one attempt.

    Args:
        attempt: the attempt's control plane.
        slots: how many slots will connect.
        secret: the job secret slots authenticate with.
        tls: optional TLS.
        bind_host: interface to listen on ("127.0.0.1" locally, "0.0.0.0" on a cluster).
        faults: the driver's fault injector (records crashes slots report).
    """

    def __init__(
        self,
        attempt: JobAttempt,
        slots: int,
        secret: bytes,
        tls: rpc.TlsConfig | None,
        bind_host: str,
        faults: FaultHook = NO_FAULTS,
    ) -> None:
        self.attempt = attempt
        self.slots = slots
        self._secret = secret
        self._tls = tls
        self._faults = faults
        self.server = socket.create_server((bind_host, 0))
        self.handles: dict[SubtaskId, RemoteTaskHandle] = {}
        self._conns: dict[int, rpc.MessageConnection] = {}
        self._registered: set[int] = set()
        self.all_registered = threading.Event()
        self.stopping = False
        self._lock = threading.Lock()
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, name="sluice-control-accept", daemon=True)
        self._acceptor.start()

    @property
    def port(self) -> int:
        return int(self.server.getsockname()[1])

    def handle(self, task: SubtaskId) -> RemoteTaskHandle:
        h = self.handles.get(task)
        if h is None:
            h = self.handles[task] = RemoteTaskHandle(task, self)
        return h

    def send_to_slot(self, slot: int, msg: tuple[Any, ...]) -> None:
        conn = self._conns.get(slot)
        if conn is not None:
            conn.send(msg)

    def broadcast(self, msg: tuple[Any, ...]) -> None:
        for conn in list(self._conns.values()):
            conn.send(msg)

    def close(self) -> None:
        """Close the server and every slot connection (slots that still run stop: they lost the driver)."""
        self.stopping = True
        self._closed = True
        try:
            self.server.close()
        except OSError:
            pass
        for conn in list(self._conns.values()):
            conn.close(flush_timeout=1.0)

    # -- connections ---------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed:
            try:
                got = rpc.accept(self.server, self._secret, self._tls)
            except OSError:
                return
            if got is not None:
                state: dict[str, Any] = {"slot": None}
                conn = rpc.MessageConnection(
                    got[0],
                    functools.partial(self._on_message, state),
                    functools.partial(self._on_closed, state),
                    "sluice-control",
                )
                state["conn"] = conn
                conn.start()

    def _on_closed(self, state: dict[str, Any], error: BaseException | None) -> None:
        slot = state["slot"]
        if slot is None or self.stopping:
            return
        with self._lock:
            if self._conns.get(slot) is state["conn"]:
                del self._conns[slot]
        self.attempt.failed(None, SlotLostError(f"slot {slot} lost its connection to the driver: {error}"))

    def _on_message(self, state: dict[str, Any], msg: tuple[Any, ...]) -> None:
        op, attempt = msg[0], msg[1]
        a = self.attempt
        if attempt != a.attempt:
            return  # a zombie slot of an earlier attempt
        if op == "hello":
            slot = int(msg[2])
            state["slot"] = slot
            with self._lock:
                self._conns[slot] = state["conn"]
        elif op == "registered":
            with self._lock:
                self._registered.add(int(msg[2]))
                if len(self._registered) == self.slots:
                    self.all_registered.set()
        elif op == "ack":
            a.acknowledge(msg[2], msg[3], msg[4])
        elif op == "decline":
            a.decline(msg[2], msg[3], msg[4])
        elif op == "end_of_input":
            a.end_of_input(msg[2])
        elif op == "finished":
            self.handle(msg[2]).contexts[0].metrics = dict(msg[3])
            a.finished(msg[2])
        elif op == "metrics":
            self.handle(msg[2]).contexts[0].metrics = dict(msg[3])
        elif op == "failed":
            a.failed(msg[2], msg[3])
        elif op == "request_split":
            a.request_split(msg[2])
        elif op == "log":
            _, _, slot, name, level, subtask, text = msg
            where = f"[slot {slot}] [{subtask}]" if subtask else f"[slot {slot}]"
            logging.getLogger(name).log(level, "%s %s", where, text)
        elif op == "fired":
            self._faults.record(str(msg[3]))
            log.info("slot %s: injected crash %s", msg[2], msg[3])
