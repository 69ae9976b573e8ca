"""The Kafka split enumerator: discovers topic partitions, resolves their offsets, assigns them to readers."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined, unused-ignore]  # needed on 2.16, not 2.12
from sluice.connectors.kafka.errors import KafkaSourceError
from sluice.connectors.kafka.offsets import (
    KafkaSplit,
    OffsetsInitializer,
    RunState,
    TopicPartitionKey,
    owner_of,
    parse_split_id,
    resolve_offsets,
    split_id,
)
from sluice.connectors.kafka.options import KafkaSourceOptions
from sluice.connectors.kafka.sampling import sample_schema
from sluice.source import EnumeratorContext, SourceSplit, SplitEnumerator

__all__ = ["BrokerOffsetLookup", "KafkaSplitEnumerator"]

log = logging.getLogger("sluice.kafka")


class BrokerOffsetLookup:
    """:class:`~sluice.connectors.kafka.offsets.OffsetLookup` over the broker.

    Watermarks and timestamps come from the AdminClient (ListOffsets with fresh metadata, so partitions
    added a moment ago resolve; read_committed, so "latest" is the last stable offset); committed offsets
    from a never-subscribed consumer of the group.
    """

    def __init__(self, admin: AdminClient, consumer: Consumer, timeout_s: float) -> None:
        self.admin = admin
        self.consumer = consumer
        self.timeout_s = timeout_s

    def _list(self, tps: list[TopicPartitionKey], spec: OffsetSpec) -> dict[TopicPartitionKey, int]:
        futures = self.admin.list_offsets(
            {TopicPartition(*tp): spec for tp in tps},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=self.timeout_s,
        )
        return {
            (tp.topic, tp.partition): f.result(timeout=self.timeout_s).offset for tp, f in futures.items()
        }

    def watermarks(self, tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, tuple[int, int]]:
        low = self._list(tps, OffsetSpec.earliest())  # type: ignore[no-untyped-call, unused-ignore]
        high = self._list(tps, OffsetSpec.latest())  # type: ignore[no-untyped-call, unused-ignore]
        return {tp: (low[tp], high[tp]) for tp in tps}

    def committed(self, tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int | None]:
        found = self.consumer.committed([TopicPartition(*tp) for tp in tps], timeout=self.timeout_s)
        return {(x.topic, x.partition): x.offset if x.offset >= 0 else None for x in found}

    def for_times(
        self, tps: list[TopicPartitionKey], timestamp_ms: int
    ) -> dict[TopicPartitionKey, int | None]:
        found = self._list(tps, OffsetSpec.for_timestamp(timestamp_ms))
        return {tp: off if off >= 0 else None for tp, off in found.items()}

    def close(self) -> None:
        self.consumer.close()


class KafkaSplitEnumerator(SplitEnumerator):
    """Discovers partitions (at start, then every ``discovery_interval_s`` when unbounded) and assigns each
    to reader ``owner_of(topic, partition, parallelism)``.

    Partitions found at start begin at ``starting_offsets``; partitions and topics found later begin at the
    earliest offset (they are new, so everything in them is new). A bounded enumerator resolves each
    split's stop offset at discovery and signals "no more splits" once its splits are assigned.

    Bounds belong to the run, not to the checkpoint: the splits a run restores (from its own checkpoint
    after a failover, or from an earlier run's) get this run's stop offsets, resolved once when the run
    starts (attempt 0) and kept by its failover attempts, so a restart never moves a ``"latest"`` stop. An
    unbounded run drops the stop offsets of an earlier bounded run. A bounded run that restores another
    run's checkpoint also discovers the partitions created since (from their earliest offset).

    Args:
        options: the source's options.
        run: what the enumerators of this run share across its attempts (the source keeps it).
        ctx: the coordinator's side of the source.
        restored: the enumerator's state from the restored checkpoint, if any.
    """

    def __init__(
        self,
        options: KafkaSourceOptions,
        run: RunState,
        ctx: EnumeratorContext,
        restored: dict[str, Any] | None,
    ) -> None:
        self.options = options
        self.run = run
        self.ctx = ctx
        self.bounded = options.bounded
        self._pending: dict[str, SourceSplit] = {}
        self._discovered: set[str] = set()
        self._signalled: set[int] = set()
        self._restored = restored is not None
        #: the first attempt of a run (a ctx without attempts, e.g. a test harness: every enumerator is)
        self._run_starts = getattr(ctx, "attempt", 0) == 0
        if self._run_starts:
            run.stops.clear()
        self._schema: Any = None
        if restored is not None:
            self._pending = {s.split_id: _copy(s) for s in restored["pending"]}
            self._discovered = set(restored["discovered"])
            self._schema = restored.get("schema")
        self._admin: AdminClient | None = None
        self._lookup: BrokerOffsetLookup | None = None
        self._discovery: Future[list[KafkaSplit]] | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        src = self.options
        self._admin = AdminClient(src.admin_conf())
        self._lookup = BrokerOffsetLookup(
            self._admin,
            Consumer(src.consumer_conf("sluice-enumerator", bounded=False)),
            src.request_timeout_s,
        )
        topics = self._list_topics()
        if self._pending:
            self._pending = {s.split_id: s for s in self._bounded(list(self._pending.values()))}
        if self._restored and self.bounded and not self._run_starts:
            return  # a failover: every split of this bounded run was discovered before
        self._discover(topics, initial=not self._restored)

    def poll(self) -> None:
        """Take the result of the last discovery round and start the next, in a thread of its own: its
        broker requests wait up to ``request_timeout_s`` when no broker answers, and the coordinator
        calls this under the lock its checkpoints need."""
        if self.bounded or self._admin is None:
            return
        done = self._discovery
        if done is not None and not done.done():
            return
        if done is not None:
            self._discovery = None
            try:
                self._adopt(done.result(), initial=False)
            except KafkaSourceError as exc:
                log.warning("%s: partition discovery failed, retrying later: %s", self.options.name, exc)
            self._assign()
        known = frozenset(self._discovered)
        fut: Future[list[KafkaSplit]] = Future()
        self._discovery = fut
        threading.Thread(
            target=self._discover_in_background, args=(fut, known), name="kafka-discovery", daemon=True
        ).start()

    def _discover_in_background(self, fut: Future[list[KafkaSplit]], known: frozenset[str]) -> None:
        try:
            fut.set_result(self._find(self._list_topics(), initial=False, known=known))
        except BaseException as exc:
            fut.set_exception(exc)

    def close(self) -> None:
        self._discovery = None  # a round under way ends by itself within request_timeout_s
        if self._lookup is not None:
            self._lookup.close()
            self._lookup = None

    # -- discovery -------------------------------------------------------------------------------------
    def _list_topics(self) -> dict[str, list[int]]:
        """Partitions of every topic the source reads; raises KafkaSourceError if the brokers don't answer."""
        assert self._admin is not None
        src = self.options
        try:
            md = self._admin.list_topics(timeout=src.request_timeout_s)
        except KafkaException as exc:
            # brokers never reached since this job started: a wrong address or security setting, which a
            # restart cannot cure; brokers that answered before and stopped: an outage, restarts apply
            reached = self.run.brokers_reached
            raise KafkaSourceError(
                f"KafkaSource {src.name!r}: cannot reach the Kafka brokers at {src.bootstrap_servers!r} "
                f"within {src.request_timeout_s:g}s ({exc.args[0].str() if exc.args else exc}). Check "
                "bootstrap_servers and the connection/security settings in consumer_config."
                + ("" if reached else " (never reached since the job started: failing at once)"),
                recoverable=reached,
            ) from None
        self.run.brokers_reached = True
        pattern = src.pattern
        listed = set(src.topics or ())
        out: dict[str, list[int]] = {}
        for name, meta in md.topics.items():
            if meta.error is not None or not meta.partitions:
                continue
            if name in listed or (
                src.topic_pattern is not None and not name.startswith("__") and pattern.fullmatch(name)
            ):
                out[name] = sorted(meta.partitions)
        return out

    def _discover(self, topics: dict[str, list[int]], initial: bool) -> None:
        self._adopt(self._find(topics, initial, frozenset(self._discovered)), initial)

    def _find(self, topics: dict[str, list[int]], initial: bool, known: frozenset[str]) -> list[KafkaSplit]:
        """Splits of the partitions in ``topics`` not ``known`` yet, with their start and stop offsets."""
        src = self.options
        if initial and src.topics is not None:
            missing = sorted(set(src.topics) - set(topics))
            if missing:
                raise KafkaSourceError(
                    f"KafkaSource {src.name!r}: topic(s) {', '.join(map(repr, missing))} not found on "
                    f"{src.bootstrap_servers!r}. Create them first, or fix the topics option.",
                    recoverable=False,
                )
        new = [(t, p) for t in sorted(topics) for p in topics[t] if split_id(t, p) not in known]
        if not new:
            return []
        assert self._lookup is not None
        start = src.starting_offsets if initial else OffsetsInitializer.earliest()
        try:
            starts = resolve_offsets(start, new, self._lookup)
            stops = self._run_stops(new)
        except (KafkaException, TimeoutError) as exc:
            if not initial and not self.bounded:  # e.g. a just-created partition's metadata: next poll
                log.warning(
                    "%s: offsets of new partitions not available yet, retrying later: %s", src.name, exc
                )
                return []
            raise KafkaSourceError(
                f"KafkaSource {src.name!r}: cannot look up offsets of {len(new)} partition(s) on "
                f"{src.bootstrap_servers!r}: {exc}"
            ) from None
        if initial and self._schema is None:
            self._schema = sample_schema(src, starts, stops)
        return [KafkaSplit(split_id(*tp), starts[tp], stops.get(tp)) for tp in new]

    def _adopt(self, splits: list[KafkaSplit], initial: bool) -> None:
        """Take newly discovered ``splits`` (those found meanwhile by another round are skipped)."""
        new = [s for s in splits if s.split_id not in self._discovered]
        for s in new:
            s.value_schema = self._schema
            self._discovered.add(s.split_id)
            self._pending[s.split_id] = s
        if new and not initial:
            log.info("%s: discovered %d new partition(s): %s", self.options.name, len(new), [s.split_id for s in new])

    # -- assignment ------------------------------------------------------------------------------------
    def add_reader(self, subtask: int) -> None:
        self._signalled.discard(subtask)  # a reader registered again (after a failure) starts with nothing
        self._assign()

    def add_splits_back(self, splits: list[SourceSplit]) -> None:
        for s in self._bounded(splits):
            self._pending[s.split_id] = s
            self._discovered.add(s.split_id)
        self._assign()

    # -- bounds ----------------------------------------------------------------------------------------
    def _run_stops(self, tps: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """This run's stop offset of each partition (empty when unbounded), resolved once per run."""
        stop = self.options.stopping_offsets
        if stop is None:
            return {}
        known = self.run.stops
        missing = [tp for tp in tps if tp not in known]
        if missing:
            assert self._lookup is not None
            known.update(resolve_offsets(stop, missing, self._lookup))
        return {tp: known[tp] for tp in tps}

    def _bounded(self, splits: list[SourceSplit]) -> list[KafkaSplit]:
        """Copies of restored ``splits`` ending where this run ends (see the class docstring)."""
        tps = [parse_split_id(s.split_id) for s in splits]
        try:
            stops = self._run_stops(tps)
        except (KafkaException, TimeoutError) as exc:
            raise KafkaSourceError(
                f"KafkaSource {self.options.name!r}: cannot look up the stopping offsets of {len(tps)} "
                f"restored partition(s) on {self.options.bootstrap_servers!r}: {exc}"
            ) from None
        out: list[KafkaSplit] = []
        changed: list[str] = []
        for s, tp in zip(splits, tps, strict=True):
            end = stops.get(tp)
            if end != s.end:
                changed.append(f"{s.split_id} {s.end} -> {end}")
            if end is not None and s.position is not None and int(s.position) > end:
                log.warning(
                    "%s: partition %s resumes at offset %s, past this run's stop offset %d: nothing to read",
                    self.options.name,
                    s.split_id,
                    s.position,
                    end,
                )
            out.append(KafkaSplit(s.split_id, s.position, end, value_schema=getattr(s, "value_schema", None)))
        if changed:
            log.info(
                "%s: this run's stop offsets replace those of the restored checkpoint: %s",
                self.options.name,
                ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else ""),
            )
        return out

    def _owner(self, sid: str) -> int:
        return owner_of(*parse_split_id(sid), int(self.ctx.parallelism))

    def _assign(self) -> None:
        registered = set(self.ctx.registered_readers())  # a failed reader is not, until it registers again
        out: dict[int, list[SourceSplit]] = {}
        for sid in sorted(self._pending):
            owner = self._owner(sid)
            if owner in registered:
                out.setdefault(owner, []).append(self._pending.pop(sid))
        if out:
            self.ctx.assign_splits(out)
        if self.bounded:
            waiting = {self._owner(sid) for sid in self._pending}
            for r in sorted(registered):
                if r not in self._signalled and r not in waiting:
                    self._signalled.add(r)
                    self.ctx.signal_no_more_splits(r)

    def snapshot_state(self, checkpoint_id: int) -> dict[str, Any]:
        return {
            "pending": [_copy(s) for s in self._pending.values()],
            "discovered": sorted(self._discovered),
            "schema": self._schema,
        }


def _copy(s: SourceSplit) -> KafkaSplit:
    return KafkaSplit(s.split_id, s.position, s.end, value_schema=getattr(s, "value_schema", None))
