"""The driver's end of the Spark runtime's control plane: a TCP server that slots report to.

:class:`ControlServer` accepts authenticated slot connections for one attempt, turns their reports
(:mod:`sluice.runtime.spark.messages`) into :class:`~sluice.runtime.attempt.JobAttempt` calls, re-emits
their log records, and sends the coordinator's notifications through :class:`RemoteTaskHandle` proxies.
Messages of another attempt are dropped.

Failures reach the attempt with their :class:`~sluice.runtime.attempt.FailureKind`: a subtask's error is
``REPORTED``; a slot connection that ends without a Goodbye is ``LOST`` (:class:`SlotLostError`: the slot's
process died, or Spark killed it because another slot failed); a slot that stopped because of another
failure (a lost peer) is a ``CONSEQUENCE``. A connection is FIFO, so a slot's reports are handled before
its end; :meth:`ControlServer.wait_closed` lets the driver wait for every slot's last word before it takes
the attempt's root cause as final.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import sluice.runtime.spark.messages as m
import sluice.runtime.spark.rpc as rpc
from sluice.errors import CheckpointFailureReason, SluiceError
from sluice.events import CheckpointBarrier
from sluice.graph import SubtaskId
from sluice.runtime.attempt import FailureKind, JobAttempt
from sluice.runtime.fault_hook import NO_FAULTS, FaultHook
from sluice.runtime.spark.listener import Listener, max_pending
from sluice.source import SourceSplit

__all__ = ["ControlServer", "RemoteTaskHandle", "SlotLostError"]

log = logging.getLogger("sluice.spark")


class SlotLostError(SluiceError):
    """A slot's connection to the driver ended without a goodbye (its process died, its executor was
    lost, or Spark killed it). If it is the root cause, look at the executor's log for why."""


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
        #: the built-in metrics the slot last reported (:mod:`sluice.runtime.task_metrics`)
        self.snapshot: dict[str, Any] = {}

    def metrics_snapshot(self) -> dict[str, Any] | None:
        """What the subtask's slot last reported, or None before its first report."""
        return self.snapshot or None

    def trigger_checkpoint(self, barrier: CheckpointBarrier) -> None:
        self._server.send_to_slot(self.id.index, m.TriggerCheckpoint(self.id, barrier))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._server.send_to_slot(self.id.index, m.CheckpointComplete(self.id, checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._server.send_to_slot(self.id.index, m.CheckpointAborted(self.id, checkpoint_id))

    def assign_splits(self, splits: list[SourceSplit]) -> None:
        self._server.send_to_slot(self.id.index, m.AssignSplits(self.id, splits))

    def no_more_splits(self) -> None:
        self._server.send_to_slot(self.id.index, m.NoMoreSplits(self.id))


class _SlotConnection:
    """One accepted control connection: which slot it serves, and whether the slot said goodbye."""

    def __init__(self) -> None:
        self.slot: int | None = None
        self.goodbye = False
        self.conn: rpc.MessageConnection | None = None


class ControlServer:
    """Serves the slots of one attempt.

    Args:
        attempt: the attempt's control plane.
        slots: how many slots will connect.
        secret: the job secret slots authenticate with.
        tls: optional TLS.
        bind_host: address to listen on (:func:`sluice.runtime.spark.cluster.bind_address`).
        faults: the driver's fault hook (records faults slots report before they crash).
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
        self.server = socket.create_server((bind_host, 0), family=rpc.address_family(bind_host))
        self._listener = Listener(
            self.server, secret, tls, self._accepted, "sluice-control", max_pending(slots)
        )
        self.handles: dict[SubtaskId, RemoteTaskHandle] = {}
        self._conns: dict[int, rpc.MessageConnection] = {}
        self._live: set[_SlotConnection] = set()
        self._registered: set[int] = set()
        #: where each slot's data plane listens (from its Hello); Peers once every slot is known
        self._addresses: dict[int, tuple[str, int]] = {}
        self._peers: m.Peers | None = None
        self.all_registered = threading.Event()
        #: Stop or Cancel once the attempt ends (sent to every slot, and to slots that connect later)
        self._final: m.Stop | m.Cancel | None = None
        #: the driver is killing the stage: connections that end from now on were ended by it
        self._killing = False
        self._lock = threading.Condition()
        self._listener.start()
        faults.hit("listening", f"driver control {bind_host}:{self.port}")

    @property
    def port(self) -> int:
        return int(self.server.getsockname()[1])

    @property
    def ending(self) -> bool:
        """The driver sent Stop or Cancel: the attempt is over."""
        return self._final is not None

    def handle(self, task: SubtaskId) -> RemoteTaskHandle:
        h = self.handles.get(task)
        if h is None:
            h = self.handles[task] = RemoteTaskHandle(task, self)
        return h

    def send_to_slot(self, slot: int, msg: m.DriverMessage) -> None:
        conn = self._conns.get(slot)
        if conn is not None:
            conn.send(msg)

    def broadcast(self, msg: m.DriverMessage) -> None:
        for conn in list(self._conns.values()):
            conn.send(msg)

    def end(self, final: m.Stop | m.Cancel) -> None:
        """End the attempt: send ``final`` to every slot (and to any slot that connects from now on)."""
        with self._lock:
            self._final = final
            conns = list(self._conns.values())
        for conn in conns:
            conn.send(final)

    def wait_closed(self, timeout: float) -> bool:
        """Wait until every slot connection ended, so every report a slot sent has been handled."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._live, timeout)

    def killing(self) -> None:
        """The driver is about to kill the stage: connections that end from now on are not failures."""
        self._killing = True

    def close(self) -> None:
        """Close the server and every slot connection (slots that still run stop: they lost the driver)."""
        self._killing = True
        self._listener.close()
        for conn in list(self._conns.values()):
            conn.close(flush_timeout=1.0)

    # -- connections ---------------------------------------------------------------------------------
    def _accepted(self, sock: socket.socket, addr: tuple[str, int]) -> None:
        """An authenticated slot connection (the Listener calls it in the connection's own thread)."""
        sc = _SlotConnection()
        sc.conn = rpc.MessageConnection(
            sock,
            functools.partial(self._on_message, sc),
            functools.partial(self._on_closed, sc),
            "sluice-control",
        )
        with self._lock:
            self._live.add(sc)
        sc.conn.start()

    def _on_closed(self, sc: _SlotConnection, error: BaseException | None) -> None:
        with self._lock:
            self._live.discard(sc)
            if sc.slot is not None and self._conns.get(sc.slot) is sc.conn:
                del self._conns[sc.slot]
            self._lock.notify_all()
        if sc.slot is None or sc.goodbye or self._killing:
            return
        if isinstance(self._final, m.Stop):
            log.warning("slot %d ended without a goodbye after the attempt finished: %s", sc.slot, error)
            return
        lost = SlotLostError(f"slot {sc.slot} lost its connection to the driver without a goodbye: {error}")
        self.attempt.failed(None, lost, FailureKind.LOST)

    def _on_message(self, sc: _SlotConnection, msg: m.Message) -> None:
        if not isinstance(msg, m.SlotMessage):
            raise m.ProtocolError(f"a slot sent the driver's message {type(msg).__name__}")
        a = self.attempt
        if msg.attempt != a.attempt:
            return  # a zombie slot of an earlier attempt
        match msg:
            case m.Hello(slot=slot, address=address):
                self._hello(sc, slot, address)
            case m.Registered(slot=slot):
                with self._lock:
                    self._registered.add(slot)
                    if len(self._registered) == self.slots:
                        self.all_registered.set()
            case m.Acknowledge(task=task, checkpoint_id=cid, handle=handle):
                a.acknowledge(task, cid, handle)
            case m.Decline(task=task, checkpoint_id=cid, reason=reason, failure=failure):
                a.decline(task, cid, reason, CheckpointFailureReason[failure])
            case m.EndOfInput(task=task):
                a.end_of_input(task)
            case m.Finished(task=task, metrics=metrics):
                self.handle(task).contexts[0].metrics = dict(metrics)
                a.finished(task)
            case m.Metrics(task=task, metrics=metrics, snapshot=snapshot):
                h = self.handle(task)
                h.contexts[0].metrics = dict(metrics)
                h.snapshot = snapshot
            case m.TaskFailed(task=task, error=error):
                a.failed(task, error, FailureKind.REPORTED)
            case m.SlotFailed(error=error, consequence=consequence):
                a.failed(None, error, FailureKind.CONSEQUENCE if consequence else FailureKind.REPORTED)
            case m.RequestSplit(task=task):
                a.request_split(task)
            case m.Log(slot=slot, logger=name, level=level, subtask=subtask, text=text):
                where = f"[slot {slot}] [{subtask}]" if subtask else f"[slot {slot}]"
                logging.getLogger(name).log(level, "%s %s", where, text)
            case m.FaultFired(slot=slot, description=description):
                self._faults.record(description)
                log.info("slot %s: injected fault %s", slot, description)
            case m.Goodbye():
                sc.goodbye = True
            case _:
                raise m.ProtocolError(f"the driver does not handle {type(msg).__name__}")

    def _hello(self, sc: _SlotConnection, slot: int, address: tuple[str, int]) -> None:
        assert sc.conn is not None
        with self._lock:
            sc.slot = slot
            self._conns[slot] = sc.conn
            self._addresses[slot] = address
            final = self._final
            late = self._peers  # a slot that connects after the rendezvous gets the addresses on its own
            fresh = None
            if late is None and len(self._addresses) == self.slots:
                fresh = self._peers = m.Peers(tuple(self._addresses[i] for i in range(self.slots)))
        self._faults.hit("listening", f"slot {slot} data plane {address[0]}:{address[1]}")
        if final is not None:
            sc.conn.send(final)
        elif late is not None:
            sc.conn.send(late)
        elif fresh is not None:
            self.broadcast(fresh)
