"""A job as the API declares it: :class:`Pipeline` (sources, the streams derived from them, sinks; start, run)."""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, Literal

from sluice.api.stream import Stream
from sluice.client import JobClient
from sluice.config import CheckpointConfig, FixedDelayRestart, RestartStrategy, validated
from sluice.config.job import JobConfig
from sluice.durations import Duration, to_seconds
from sluice.errors import ConfigError, GraphError
from sluice.graph import JobGraph, LogicalEdge, LogicalGraph, LogicalNode, NodeKind, build_job_graph
from sluice.operators.stateless import PassThroughOperator
from sluice.runtime.fault_hook import NO_FAULTS, FaultHook
from sluice.runtime.job import JobResult, check_at_start
from sluice.runtime.probes import probe_sinks
from sluice.source import Source
from sluice.state.config import StateBackendConfig

__all__ = ["DEFAULT_CONTROL_ENDPOINT", "RUNTIMES", "Launcher", "Pipeline", "launched_by"]

RUNTIMES = ("local", "spark")
#: where ``Pipeline.start`` serves the control endpoint unless told otherwise: loopback, a free port
DEFAULT_CONTROL_ENDPOINT = "127.0.0.1:0"


#: runs a pipeline for :meth:`Pipeline.run` with the arguments of its call: ``sluice run``'s (its runtime,
#: control endpoint, progress, savepoint on SIGTERM), as ``env.execute()`` takes ``flink run``'s options
Launcher = Callable[["Pipeline", dict[str, Any]], JobResult]
_launcher: ContextVar[Launcher | None] = ContextVar("sluice_launcher", default=None)


@contextlib.contextmanager
def launched_by(launcher: Launcher) -> Iterator[None]:
    """While the block runs, :meth:`Pipeline.run` hands its pipeline and arguments to ``launcher`` instead
    of running it itself (``sluice run`` loads a job file inside this block, so ``p.run()`` at module level
    or under ``if __name__ == "__main__":`` runs with the command line's options, whatever ``p`` is named).
    """
    token = _launcher.set(launcher)
    try:
        yield
    finally:
        _launcher.reset(token)


def _job_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "job"


class Pipeline:
    """A job: sources, the streams derived from them, and sinks.

    Args:
        name: the job's name; also its job id in checkpoint storage, so a re-run resumes from the latest
            completed checkpoint of the same name (``restore="none"`` to start fresh).
        parallelism: default parallelism of operators.
        max_parallelism: number of key groups (upper bound for any operator's parallelism; fixed for the
            life of the job's state).
        checkpoint: a CheckpointConfig (or dict of its options).
        restart: restart strategy (FixedDelayRestart, ExponentialBackoffRestart, FailureRateRestart, NoRestart).
        buffers_per_channel: credits (and output queue slots) per channel: bounds memory under backpressure.
        max_batch_rows: split larger batches so one batch's processing (and a barrier's wait) is bounded;
            0 = never split.
        metrics: count the tasks' built-in metrics (records and bytes in and out, busy and backpressured
            time, per batch: cheap, see docs/benchmarks.md); False only to measure what they cost.
        state_backend: where keyed state lives and how it is checkpointed: a StateBackendConfig (or dict of
            its options), e.g. ``{"type": "rocksdb", "incremental": True}``; default the hashmap backend
            (docs/state.md).
        task_cancellation_timeout: how long (a duration: ``"1 min"``, a timedelta, seconds) an ending attempt waits for its tasks' threads (task threads and
            their checkpoint upload threads) before a restart starts the next one; a thread still running
            then is named in a warning.
    """

    def __init__(
        self,
        name: str,
        *,
        parallelism: int = 1,
        max_parallelism: int = 128,
        checkpoint: CheckpointConfig | dict[str, Any] | None = None,
        restart: RestartStrategy | None = None,
        buffers_per_channel: int = 4,
        max_batch_rows: int = 0,
        metrics: bool = True,
        state_backend: StateBackendConfig | dict[str, Any] | None = None,
        task_cancellation_timeout: Duration = 60.0,
    ) -> None:
        if not isinstance(parallelism, int) or parallelism < 1:
            raise ConfigError(f"Pipeline: parallelism must be an integer >= 1 (got {parallelism!r})")
        if not isinstance(max_parallelism, int) or not 1 <= max_parallelism <= 32768:
            raise ConfigError(
                f"Pipeline: max_parallelism must be an integer in 1..32768 (got {max_parallelism!r})"
            )
        if not isinstance(buffers_per_channel, int) or buffers_per_channel < 1:
            raise ConfigError(
                f"Pipeline: buffers_per_channel must be an integer >= 1 (got {buffers_per_channel!r})"
            )
        if not isinstance(max_batch_rows, int) or max_batch_rows < 0:
            raise ConfigError(f"Pipeline: max_batch_rows must be an integer >= 0 (got {max_batch_rows!r})")
        cancellation_timeout = to_seconds(
            task_cancellation_timeout, "Pipeline(task_cancellation_timeout)", sign="non-negative"
        )
        if restart is not None and not isinstance(restart, RestartStrategy):
            raise ConfigError(
                "Pipeline: restart must be a RestartStrategy (FixedDelayRestart, "
                "ExponentialBackoffRestart, FailureRateRestart, NoRestart)"
            )
        self.name = name
        self.checkpoint: CheckpointConfig = (
            CheckpointConfig()
            if checkpoint is None
            else validated(CheckpointConfig, checkpoint, "checkpoint")
        )
        self.restart = restart or FixedDelayRestart(attempts=3, delay=1.0)
        self.buffers_per_channel = buffers_per_channel
        self.max_batch_rows = max_batch_rows
        self.metrics = bool(metrics)
        self.task_cancellation_timeout = cancellation_timeout
        self.state_backend: StateBackendConfig = (
            StateBackendConfig()
            if state_backend is None
            else validated(StateBackendConfig, state_backend, "state_backend")
        )
        self.graph = LogicalGraph(max_parallelism=max_parallelism, default_parallelism=parallelism)
        self._ids = itertools.count()
        self._names: set[str] = set()

    # -- building --------------------------------------------------------------------------------------
    def _fresh(self, base: str) -> str:
        """``base``, or if an operator has that name ``base-2``, ``base-3``, ...: the first one unused."""
        if base not in self._names:
            return base
        n = 2
        while f"{base}-{n}" in self._names:
            n += 1
        return f"{base}-{n}"

    def _add(
        self,
        label: str,
        name: str | None,
        make: Callable[[str], Any],
        parallelism: int | None,
        inputs: list[LogicalEdge],
        **kw: Any,
    ) -> LogicalNode:
        if parallelism is not None and (not isinstance(parallelism, int) or parallelism < 1):
            raise ConfigError(f"{name or label}: parallelism must be an integer >= 1 (got {parallelism!r})")
        if name is not None and name in self._names:
            raise GraphError(f"two operators are named {name!r}: names identify state, make them unique")
        node_name = name if name is not None else self._fresh(label)
        self._names.add(node_name)
        node_kind = kw.pop("kind", NodeKind.OPERATOR)
        node = LogicalNode(next(self._ids), node_name, node_kind, lambda: None, parallelism, inputs, **kw)
        # operators carry their node's uid as their name: it keys their state in checkpoints
        node.factory = lambda: make(node.uid)
        return self.graph.add(node)

    def source(
        self,
        source: Source,
        *,
        name: str | None = None,
        parallelism: int | None = None,
        uid: str | None = None,
    ) -> Stream:
        """Add a source; returns its stream (``uid``: see :meth:`Stream.uid`)."""
        if not isinstance(source, Source):
            raise ConfigError(f"source: expected a sluice Source, got {type(source).__name__}")
        source.validate()
        # an unnamed source is named after its kind; a second one of that kind gets "-2" (as other steps)
        node = self._add(
            source.name or "source",
            name,
            PassThroughOperator,
            parallelism,
            [],
            kind=NodeKind.SOURCE,
            spec=source,
        )
        stream = Stream(self, node, schema=source.output_schema)
        return stream.uid(uid) if uid is not None else stream

    def build(self) -> JobGraph:
        """Validate and chain the graph (raises GraphError / ConfigError)."""
        return build_job_graph(self.graph)

    def job_config(
        self,
        restore: str = "latest",
        recover_without_channel_state: int | None = None,
        job_id: str | None = None,
        allow_non_restored_state: bool = False, allow_reprocessing: bool = False,
        allow_changed_operators: bool = False,
    ) -> JobConfig:
        return JobConfig(
            job_id=job_id or _job_id(self.name),
            checkpoint=self.checkpoint.with_resolved_key(),  # resolved here, on the driver: travels with the job
            restart=self.restart,
            buffers_per_channel=self.buffers_per_channel,
            max_batch_rows=self.max_batch_rows,
            restore=restore,
            recover_without_channel_state=recover_without_channel_state,
            allow_non_restored_state=allow_non_restored_state, allow_reprocessing=allow_reprocessing,
            allow_changed_operators=allow_changed_operators,
            metrics=self.metrics,
            state_backend=self.state_backend,
            task_cancellation_timeout=self.task_cancellation_timeout,
        )

    # -- running ---------------------------------------------------------------------------------------
    def start(
        self,
        *,
        runtime: Literal["local", "spark"] = "spark",
        restore: str = "latest",
        recover_without_channel_state: int | None = None,
        allow_non_restored_state: bool = False, allow_reprocessing: bool = False,
        allow_changed_operators: bool = False,
        faults: FaultHook | None = None,
        spark_master: str | None = None,
        control_endpoint: str | None = DEFAULT_CONTROL_ENDPOINT,
    ) -> JobClient:
        """Start the job in the background and return a client to wait for, cancel or savepoint it.

        Args:
            runtime: ``"spark"`` (embedded local Spark, or the cluster of spark-submit / ``spark_master``) or
                ``"local"`` (threads in this process).
            restore: ``"latest"`` (resume the job's latest completed checkpoint), ``"none"``, or the path of
                a checkpoint or savepoint.
            recover_without_channel_state: drop the unaligned channel state of this checkpoint id on
                restore (loses its in-flight data).
            allow_non_restored_state: restore even if the checkpoint holds state of operator uids this job
                no longer has (renamed or removed operators); that state is dropped.
            allow_reprocessing: run even if a sink holds newer checkpoints than the restored one (duplicates).
            allow_changed_operators: restore operators whose state depends on settings that changed since the
                checkpoint (a window's size, a deduplication's horizon, key columns: docs/upgrades.md); their
                old state is read with the new settings. Without it such a restore fails, naming the change.
            faults: for tests (:mod:`sluice.testing.faults`): a hook the engine calls at named points.
            spark_master: the Spark master URL (``runtime="spark"``).
            control_endpoint: ``HOST:PORT`` of the job's control endpoint and dashboard (port 0: a free
                port; loopback by default), or None; requests need the job's token (docs/operations.md).
        """
        if runtime not in RUNTIMES:
            raise ConfigError(f"run: runtime must be one of {RUNTIMES} (got {runtime!r})")
        job = self.build()
        cfg = self.job_config(
            restore, recover_without_channel_state, None, allow_non_restored_state, allow_reprocessing,
            allow_changed_operators,
        )
        check_at_start(cfg)  # unwritable storage, a lost newest checkpoint: refused before anything runs
        probe_sinks(job)  # an unwritable output, a missing bucket, topic or table, wrong credentials: the same
        sock = None
        if control_endpoint is not None:  # bound before the job starts; aiohttp loads only when it serves
            from sluice.control.server import ControlEndpoint
            sock = ControlEndpoint.bind(control_endpoint)
        if runtime == "local":
            from sluice.runtime.local import LocalRuntime

            rt: Any = LocalRuntime()
        else:
            from sluice.runtime.spark import SparkRuntime

            rt = SparkRuntime(master=spark_master)
        client = JobClient(job, cfg, rt, faults or NO_FAULTS)
        if sock is not None:
            ControlEndpoint.start(client, sock)
        return client

    def run(self, **kwargs: Any) -> JobResult:
        """Run the job to completion (bounded sources) and return its result. See :meth:`start`.

        Under ``sluice run`` the job runs with the command line's options (``--runtime``, ``--restore``,
        the control endpoint, live progress, a savepoint on SIGTERM); an argument given here applies where
        the command line leaves that option at its default.
        """
        launcher = _launcher.get()
        if launcher is not None:
            return launcher(self, kwargs)
        return self.start(**kwargs).wait()
