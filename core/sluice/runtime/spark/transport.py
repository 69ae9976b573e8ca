"""Channels between subtasks in different slots: Arrow IPC frames over one TCP connection per slot pair.

All channels from slot i to slot j share one :class:`Link` (a TCP connection opened by i). Frames carry
a header ``(channel id, kind, length)``; data and events flow i -> j, credits flow back j -> i on the same
socket. The flow control is LocalChannel's, split over the two ends:

* :class:`RemoteOutputChannel` (sender) keeps the **output queue** and a credit count. A data batch goes on
  the wire only against a credit; events need none but never pass queued data. A priority event goes on the
  wire at once, ahead of the output queue; the queued batches it overtook are returned to the caller (the
  sender's output channel state) and still follow it.
* :class:`RemoteInputChannel` (receiver) keeps the **input queue** and returns one credit per data batch it
  hands to the task. A priority event is put at the head of the input queue; the batches queued there when
  it arrived become the receiver's input channel state (``take_overtaken``); batches arriving after it were
  sent after it.

Batches already on the wire when a priority event is sent arrive before it and are therefore overtaken at
the receiver: every batch is in exactly one of the two snapshots. Link writers are FIFO for that reason.
"""

from __future__ import annotations

import enum
import logging
import pickle
import queue
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import pyarrow as pa

import sluice.runtime.spark.rpc as rpc
from sluice.runtime.channels import InputQueue, Signal
from sluice.runtime.spark.listener import Listener, max_pending

__all__ = ["DataPlane", "FrameKind", "Link", "RemoteInputChannel", "RemoteOutputChannel"]

log = logging.getLogger("sluice.spark.transport")

_HEADER = struct.Struct("!IBI")  # channel id, kind, payload length
_CREDIT = struct.Struct("!I")


class FrameKind(enum.IntEnum):
    HELLO = 0  # payload: the connecting slot's index (first frame of a link)
    SCHEMA = 1  # Arrow IPC schema message; later DATA frames of the channel use it
    DATA = 2  # Arrow IPC record batch message
    STREAM = 3  # a whole Arrow IPC stream of one batch (schemas with dictionaries)
    EVENT = 4  # pickled event, in order
    PRIORITY = 5  # pickled event, to the head of the receiver's input queue
    CREDIT = 6  # receiver -> sender: payload u32 credits
    BYE = 7  # orderly close: the EOF that follows is not a failure


class Link:
    """One direction of traffic between two slots (plus its credits) over one authenticated socket.

    Create it before the connection exists, register channels, then :meth:`attach` the socket. A writer
    thread serializes and sends frames in FIFO order; a reader thread decodes incoming frames.
    """

    def __init__(self, peer: int, on_lost: Callable[[int, BaseException], None]) -> None:
        self.peer = peer
        self.inputs: dict[int, RemoteInputChannel] = {}
        self.outputs: dict[int, RemoteOutputChannel] = {}
        self._on_lost = on_lost
        self._out: queue.SimpleQueue[tuple[int, FrameKind, Any] | None] = queue.SimpleQueue()
        self._sock: socket.socket | None = None
        self._sent_schema: dict[int, pa.Schema] = {}
        self._recv_schema: dict[int, pa.Schema] = {}
        self._bye = False
        self._closing = False
        self._threads: list[threading.Thread] = []
        self.bytes_sent = 0

    def attach(self, sock: socket.socket) -> None:
        self._sock = sock
        for target, name in ((self._write, "out"), (self._read, "in")):
            t = threading.Thread(target=target, name=f"link-{self.peer}-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def enqueue(self, channel: int, kind: FrameKind, obj: Any = None) -> None:
        self._out.put((channel, kind, obj))

    def close(self, orderly: bool, timeout: float = 2.0) -> None:
        """Stop the link; ``orderly`` first sends BYE and flushes what is queued."""
        self._closing = True
        if orderly and self._sock is not None:
            self.enqueue(0, FrameKind.BYE)
        self._out.put(None)
        if orderly and self._threads:
            self._threads[0].join(timeout)
        if self._sock is not None:
            rpc.shutdown(self._sock)
        for t in self._threads:
            t.join(timeout)

    # -- writer ----------------------------------------------------------------------------------------
    def _frame(self, channel: int, kind: FrameKind, payload: Any) -> None:
        assert self._sock is not None
        n = len(payload)
        header = _HEADER.pack(channel, kind, n)
        if n < 65536:
            self._sock.sendall(header + bytes(payload))
        else:
            self._sock.sendall(header)
            self._sock.sendall(payload)
        self.bytes_sent += n + _HEADER.size

    def _write(self) -> None:
        try:
            while True:
                item = self._out.get()
                if item is None:
                    return
                channel, kind, obj = item
                if kind is FrameKind.DATA:
                    self._write_batch(channel, obj)
                elif kind in (FrameKind.EVENT, FrameKind.PRIORITY):
                    self._frame(channel, kind, pickle.dumps(obj, protocol=5))
                elif kind is FrameKind.CREDIT:
                    self._frame(channel, kind, _CREDIT.pack(obj))
                elif kind is FrameKind.HELLO:
                    self._frame(0, kind, _CREDIT.pack(obj))
                else:
                    self._frame(channel, kind, b"")
        except (OSError, ValueError) as exc:
            self._lost(exc)

    def _write_batch(self, channel: int, batch: pa.RecordBatch) -> None:
        schema = batch.schema
        if any(pa.types.is_dictionary(f.type) for f in schema):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, schema) as w:
                w.write_batch(batch)
            self._frame(channel, FrameKind.STREAM, sink.getvalue())
            return
        last = self._sent_schema.get(channel)
        if last is not schema and (last is None or not last.equals(schema, check_metadata=True)):
            self._frame(channel, FrameKind.SCHEMA, schema.serialize())
            self._sent_schema[channel] = schema
        self._frame(channel, FrameKind.DATA, batch.serialize())

    # -- reader ----------------------------------------------------------------------------------------
    def _read(self) -> None:
        assert self._sock is not None
        try:
            while True:
                channel, kind, n = _HEADER.unpack(rpc.recv_exact(self._sock, _HEADER.size))
                payload = rpc.recv_exact(self._sock, n) if n else bytearray()
                self._dispatch(channel, FrameKind(kind), payload)
        except (OSError, ValueError, EOFError) as exc:
            if not self._bye and not self._closing:
                self._lost(exc)

    def _dispatch(self, channel: int, kind: FrameKind, payload: bytearray) -> None:
        if kind is FrameKind.CREDIT:
            self.outputs[channel].on_credit(_CREDIT.unpack(payload)[0])
        elif kind is FrameKind.SCHEMA:
            self._recv_schema[channel] = pa.ipc.read_schema(pa.py_buffer(payload))
        elif kind is FrameKind.DATA:
            batch = pa.ipc.read_record_batch(pa.py_buffer(payload), self._recv_schema[channel])
            self.inputs[channel].on_item(batch)
        elif kind is FrameKind.STREAM:
            self.inputs[channel].on_item(pa.ipc.open_stream(pa.py_buffer(payload)).read_next_batch())
        elif kind is FrameKind.EVENT:
            self.inputs[channel].on_item(pickle.loads(payload))
        elif kind is FrameKind.PRIORITY:
            self.inputs[channel].on_priority(pickle.loads(payload))
        elif kind is FrameKind.BYE:
            self._bye = True
        else:
            raise ValueError(f"unexpected frame kind {kind.name} on a link")

    def _lost(self, exc: BaseException) -> None:
        if not self._closing and not self._bye:
            self._closing = True
            self._on_lost(self.peer, exc)


class RemoteOutputChannel:
    """The sender's end of a cross-slot channel: output queue + credits (an OutputChannel)."""

    def __init__(self, link: Link, channel: int, credits: int, output_capacity: int) -> None:
        self._link = link
        self._id = channel
        self._credits = credits
        self._capacity = output_capacity
        self._output: deque[Any] = deque()
        self._out_data = 0
        self._lock = threading.Lock()
        self.sender_wakeup: Callable[[], None] | None = None
        link.outputs[channel] = self

    def _wire(self, item: Any) -> None:
        if isinstance(item, pa.RecordBatch):
            self._credits -= 1
            self._link.enqueue(self._id, FrameKind.DATA, item)
        else:
            self._link.enqueue(self._id, FrameKind.EVENT, item)

    def send(self, item: Any) -> None:
        is_data = isinstance(item, pa.RecordBatch)
        with self._lock:
            if not self._output and (not is_data or self._credits > 0):
                self._wire(item)
            else:
                self._output.append(item)
                if is_data:
                    self._out_data += 1

    def send_priority(self, event: Any) -> list[pa.RecordBatch]:
        with self._lock:
            overtaken = [x for x in self._output if isinstance(x, pa.RecordBatch)]
            self._link.enqueue(self._id, FrameKind.PRIORITY, event)
        return overtaken

    def is_available(self) -> bool:
        return self._out_data < self._capacity

    def queued_output(self) -> int:
        return self._out_data

    def on_credit(self, n: int) -> None:
        """Link reader: the receiver consumed ``n`` batches; send what the new credit allows."""
        moved = False
        with self._lock:
            self._credits += n
            while self._output:
                head = self._output[0]
                is_data = isinstance(head, pa.RecordBatch)
                if is_data and self._credits <= 0:
                    break
                self._wire(self._output.popleft())
                if is_data:
                    self._out_data -= 1
                    moved = True
        if moved and self.sender_wakeup is not None:
            self.sender_wakeup()


class RemoteInputChannel(InputQueue):
    """The receiver's end of a cross-slot channel: input queue, one credit back per batch (an InputChannel)."""

    def __init__(self, link: Link, channel: int, receiver: Signal) -> None:
        super().__init__()
        self._link = link
        self._id = channel
        self._recv = receiver
        self._lock = threading.Lock()
        link.inputs[channel] = self

    def on_item(self, item: Any) -> None:
        with self._lock:
            self._input.append(item)
        self._recv.notify()

    def on_priority(self, event: Any) -> None:
        with self._lock:
            self._insert_priority(event)  # what it overtakes is fixed on arrival
        self._recv.notify()

    def poll(self) -> Any | None:
        with self._lock:
            if not self._input:
                return None
            item = self._input.popleft()
            is_data = isinstance(item, pa.RecordBatch)
            self._polled(item)
        if is_data:
            self._link.enqueue(self._id, FrameKind.CREDIT, 1)
        return item

    def find_barrier(self, checkpoint_id: int) -> list[pa.RecordBatch] | None:
        """Pull barrier ``checkpoint_id`` to the head if it is in the input queue (the sender's output queue
        is in another process: None if the barrier has not arrived yet)."""
        with self._lock:
            return self._pull_from_input(checkpoint_id)[0]
        return None


class DataPlane:
    """A slot's links to every other slot: a listening socket, then one outbound and one inbound link each.

    Args:
        me: this slot's index.
        slots: number of slots.
        secret: the job secret every link authenticates with.
        tls: optional TLS for the links.
        bind_host: address to listen on (:func:`sluice.runtime.spark.cluster.bind_address`).
        on_lost: called with (peer, error) when a link breaks without an orderly BYE.
    """

    def __init__(
        self,
        me: int,
        slots: int,
        secret: bytes,
        tls: rpc.TlsConfig | None,
        bind_host: str,
        on_lost: Callable[[int, BaseException], None],
    ) -> None:
        self.me = me
        self.secret = secret
        self.tls = tls
        self.server = socket.create_server((bind_host, 0), family=rpc.address_family(bind_host))
        peers = [j for j in range(slots) if j != me]
        self.outbound = {j: Link(j, on_lost) for j in peers}
        self.inbound = {j: Link(j, on_lost) for j in peers}
        self._accepted: set[int] = set()
        self._accepted_changed = threading.Condition()
        self._listener: Listener | None = None

    @property
    def port(self) -> int:
        return int(self.server.getsockname()[1])

    def output_channel(self, peer: int, channel: int, credits: int) -> RemoteOutputChannel:
        return RemoteOutputChannel(self.outbound[peer], channel, credits, credits)

    def input_channel(self, peer: int, channel: int, receiver: Signal) -> RemoteInputChannel:
        return RemoteInputChannel(self.inbound[peer], channel, receiver)

    def connect(self, addresses: list[tuple[str, int]], timeout: float = 60.0) -> None:
        """Open a link to every peer and accept one from every peer; connections that do not authenticate
        or say hello are dropped without holding up the others (:class:`~sluice.runtime.spark.listener.Listener`)."""
        deadline = time.monotonic() + timeout
        self._listener = Listener(
            self.server,
            self.secret,
            self.tls,
            self._inbound,
            f"slot-{self.me}-links",
            max_pending(len(self.inbound)),
        ).start()
        for j, link in self.outbound.items():
            host, port = addresses[j]
            sock = rpc.connect(
                host, port, self.secret, self.tls, timeout=max(1.0, deadline - time.monotonic())
            )
            link.attach(sock)
            link.enqueue(0, FrameKind.HELLO, self.me)
        with self._accepted_changed:
            done = self._accepted_changed.wait_for(
                lambda: len(self._accepted) == len(self.inbound), max(0.0, deadline - time.monotonic())
            )
            missing = sorted(set(self.inbound) - self._accepted)
        self._listener.close()  # every peer is linked: accept nothing more
        if not done:
            raise TimeoutError(f"slot {self.me}: slots {missing} did not connect within {timeout:.0f}s")

    def _inbound(self, sock: socket.socket, addr: tuple[str, int]) -> None:
        """An authenticated peer's link: its hello names the peer (Listener calls it in its own thread)."""
        try:
            sock.settimeout(rpc.HANDSHAKE_TIMEOUT)
            _, kind, n = _HEADER.unpack(rpc.recv_exact(sock, _HEADER.size))
            if kind != FrameKind.HELLO or n != _CREDIT.size:
                raise ValueError(f"the first frame is {kind} of {n} bytes, not a hello")
            (peer,) = _CREDIT.unpack(rpc.recv_exact(sock, n))
            sock.settimeout(None)
        except (OSError, ValueError, struct.error) as exc:
            log.warning("slot %d: a peer link from %s:%s broke before its hello: %s", self.me, *addr[:2], exc)
            rpc.shutdown(sock)
            return
        with self._accepted_changed:
            if peer not in self.inbound or peer in self._accepted:
                rpc.shutdown(sock)
                return
            self._accepted.add(peer)
            self.inbound[peer].attach(sock)
            self._accepted_changed.notify_all()

    def close(self, orderly: bool) -> None:
        if self._listener is not None:
            self._listener.close()
        try:
            self.server.close()
        except OSError:
            pass
        for link in [*self.outbound.values(), *self.inbound.values()]:
            link.close(orderly)
