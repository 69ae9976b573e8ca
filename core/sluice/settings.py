"""Configuration outside the code: Flink's key names, from a YAML file and ``-D key=value`` overrides.

``sluice run job.py --conf job.yaml -D execution.checkpointing.interval='30 s'`` changes a job's
checkpointing, restart strategy and parallelism without touching its code. Precedence: what the job's
code sets < the file < ``-D``. Keys are Flink's where Flink has one (:data:`KEYS` lists them all); values
are validated as the code's options are, and a wrong key or value is one ``ConfigError`` line naming it.

Durations take a unit (``500 ms``, ``30 s``, ``30s``, ``5 min``, ``1 h``, ``1 d``; :mod:`sluice.durations`).
Flink reads a bare number as milliseconds while sluice's Python options read it as seconds: here a bare
number is refused rather than guessed. A YAML file may nest keys (``execution: {checkpointing: {interval: 30 s}}``) or write them flat.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.config import (
    CheckpointConfig,
    ExponentialBackoffRestart,
    FailureRateRestart,
    FixedDelayRestart,
    NoRestart,
    RestartStrategy,
)
from sluice.durations import to_seconds
from sluice.errors import ConfigError
from sluice.state.config import STATE_KEYS, StateBackendConfig

if TYPE_CHECKING:
    from sluice.api import Pipeline

__all__ = ["KEYS", "configure", "load_settings", "parse_duration", "parse_overrides"]

def parse_duration(key: str, value: Any) -> float:
    """Seconds in ``value``, a duration with a unit as Flink writes it (:mod:`sluice.durations`; a bare
    number is refused); ConfigError naming ``key``."""
    return to_seconds(value, key, sign="non-negative", bare="refuse")


def _int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not re.fullmatch(r"\s*-?\d+\s*", str(value)):
        raise ConfigError(f"{key}: {value!r} is not an integer")
    return int(value)


def _float(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {value!r} is not a number") from None


def _bool(key: str, value: Any) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ConfigError(f"{key}: {value!r} is not a boolean (true or false)")
    return text == "true"


def _text(key: str, value: Any) -> str:
    if not str(value).strip():
        raise ConfigError(f"{key}: must not be empty")
    return str(value).strip()


def _choice(mapping: Mapping[str, Any]) -> Callable[[str, Any], Any]:
    def parse(key: str, value: Any) -> Any:
        text = str(value).strip().lower().replace("_", "-")
        if text not in mapping:
            raise ConfigError(f"{key}: {value!r} is not allowed (allowed: {', '.join(sorted(mapping))})")
        return mapping[text]

    return parse


@dataclass(frozen=True)
class _Key:
    """Where a key goes: ``target`` (checkpoint, storage_options, restart, pipeline, state_backend) and its
    field there."""

    target: str
    field: str
    parse: Callable[[str, Any], Any]


_RESTART_TYPES = {
    "none": NoRestart, "off": NoRestart, "disable": NoRestart, "no-restart": NoRestart,
    "fixed-delay": FixedDelayRestart, "fixeddelay": FixedDelayRestart,
    "exponential-delay": ExponentialBackoffRestart, "exponentialdelay": ExponentialBackoffRestart,
    "failure-rate": FailureRateRestart, "failurerate": FailureRateRestart,
}  # fmt: skip

#: every key sluice reads, by Flink's name (aliases included), and the option it sets
KEYS: dict[str, _Key] = {
    "execution.checkpointing.interval": _Key("checkpoint", "interval", parse_duration),
    "execution.checkpointing.mode": _Key(
        "checkpoint", "mode", _choice({"exactly-once": "exactly_once", "at-least-once": "at_least_once"})
    ),
    "execution.checkpointing.timeout": _Key("checkpoint", "timeout", parse_duration),
    "execution.checkpointing.min-pause": _Key("checkpoint", "min_pause", parse_duration),
    "execution.checkpointing.max-concurrent-checkpoints": _Key("checkpoint", "max_concurrent", _int),
    "execution.checkpointing.tolerable-failed-checkpoints": _Key(
        "checkpoint", "tolerable_failed_checkpoints", _int
    ),
    "execution.checkpointing.unaligned": _Key("checkpoint", "unaligned", _bool),
    "execution.checkpointing.unaligned.enabled": _Key("checkpoint", "unaligned", _bool),
    "execution.checkpointing.aligned-checkpoint-timeout": _Key(
        "checkpoint", "aligned_checkpoint_timeout", parse_duration
    ),
    "execution.checkpointing.num-retained": _Key("checkpoint", "num_retained", _int),
    "state.checkpoints.num-retained": _Key("checkpoint", "num_retained", _int),
    "web.checkpoints.history": _Key("checkpoint", "history_size", _int),
    "execution.checkpointing.externalized-checkpoint-retention": _Key(
        "checkpoint",
        "retain_on_cancel",
        _choice({"retain-on-cancellation": True, "delete-on-cancellation": False}),
    ),
    "state.checkpoints.dir": _Key("checkpoint", "storage", _text),
    "execution.checkpointing.dir": _Key("checkpoint", "storage", _text),
    "s3.endpoint": _Key("storage_options", "endpoint_url", _text),
    "s3.access-key": _Key("storage_options", "aws_access_key_id", _text),
    "s3.secret-key": _Key("storage_options", "aws_secret_access_key", _text),
    "s3.region": _Key("storage_options", "region_name", _text),
    "restart-strategy.type": _Key("restart", "type", _choice(_RESTART_TYPES)),
    "restart-strategy": _Key("restart", "type", _choice(_RESTART_TYPES)),
    "restart-strategy.fixed-delay.attempts": _Key("fixed-delay", "attempts", _int),
    "restart-strategy.fixed-delay.delay": _Key("fixed-delay", "delay", parse_duration),
    "restart-strategy.exponential-delay.initial-backoff": _Key("exponential-delay", "initial", parse_duration),
    "restart-strategy.exponential-delay.max-backoff": _Key("exponential-delay", "max_delay", parse_duration),
    "restart-strategy.exponential-delay.backoff-multiplier": _Key("exponential-delay", "multiplier", _float),
    "restart-strategy.exponential-delay.attempts-before-reset-backoff": _Key(
        "exponential-delay", "max_attempts", _int
    ),
    "restart-strategy.failure-rate.max-failures-per-interval": _Key("failure-rate", "max_failures", _int),
    "restart-strategy.failure-rate.failure-rate-interval": _Key("failure-rate", "interval", parse_duration),
    "restart-strategy.failure-rate.delay": _Key("failure-rate", "delay", parse_duration),
    "parallelism.default": _Key("pipeline", "default_parallelism", _int),
    "pipeline.max-parallelism": _Key("pipeline", "max_parallelism", _int),
    "task.cancellation.timeout": _Key("task", "task_cancellation_timeout", parse_duration),
    # the state backend (state.backend.type, state.backend.incremental, ...: docs/state.md)
    **{key: _Key("state_backend", field, parse) for key, (field, parse) in STATE_KEYS.items()},
}

_STRATEGY_OF: dict[str, type[RestartStrategy]] = {
    "fixed-delay": FixedDelayRestart,
    "exponential-delay": ExponentialBackoffRestart,
    "failure-rate": FailureRateRestart,
}


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):  # no key takes a mapping (``state.backend`` is a key and a prefix)
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_settings(path: str) -> dict[str, Any]:
    """The settings of a YAML file (nested or flat keys), flattened to Flink key names."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--conf: no such file {path!r}")
    try:
        tree = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"--conf {path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(tree, Mapping):
        raise ConfigError(f"--conf {path}: expected a mapping of settings, got {type(tree).__name__}")
    return _flatten(tree)


def parse_overrides(pairs: Iterable[str]) -> dict[str, str]:
    """``-D key=value`` pairs as a dict (later pairs win)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-D {pair!r}: expected key=value, e.g. -D execution.checkpointing.interval='30 s'")
        out[key.strip()] = value.strip().strip("'\"")
    return out


def _check_key(key: str) -> _Key:
    if key in KEYS:
        return KEYS[key]
    near = difflib.get_close_matches(key, list(KEYS), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ConfigError(f"unknown setting {key!r}{hint}; the settings sluice reads are listed in docs/configuration.md")


def _restart(
    current: RestartStrategy, typed: type[RestartStrategy] | None, fields: dict[str, dict[str, Any]]
) -> RestartStrategy:
    """The restart strategy after ``restart-strategy.*`` settings (``fields`` by strategy name)."""
    given = [name for name, f in fields.items() if f]
    if typed is None:
        if not given:
            return current
        typed = _STRATEGY_OF[given[0]]
        if len(given) > 1 or not isinstance(current, typed):
            raise ConfigError(
                f"restart-strategy.{given[0]}.* set without restart-strategy.type: {given[0]} "
                f"(the job's strategy is {type(current).__name__})"
            )
    name = next((n for n, cls in _STRATEGY_OF.items() if cls is typed), None)
    stray = [n for n in given if n != name]
    if stray:
        raise ConfigError(
            f"restart-strategy.{stray[0]}.* does not apply to restart-strategy.type {name or 'none'}"
        )
    base = current.model_dump() if isinstance(current, typed) else {}
    return typed(**{**base, **fields.get(name or "", {})})


def configure(pipeline: Pipeline, settings: Mapping[str, Any]) -> Pipeline:
    """Apply Flink-keyed ``settings`` to ``pipeline`` (over what its code set) and return it.

    Raises:
        ConfigError: an unknown key, a value that does not parse, or options that do not fit together.
    """
    checkpoint: dict[str, Any] = {}
    storage_options: dict[str, Any] = {}
    restart_type: type[RestartStrategy] | None = None
    restart_fields: dict[str, dict[str, Any]] = {name: {} for name in _STRATEGY_OF}
    graph: dict[str, int] = {}
    state: dict[str, Any] = {}
    for key, value in settings.items():
        spec = _check_key(key)
        parsed = spec.parse(key, value)
        if spec.target == "checkpoint":
            checkpoint[spec.field] = parsed
        elif spec.target == "storage_options":
            storage_options[spec.field] = parsed
        elif spec.target == "state_backend":
            state[spec.field] = parsed
        elif spec.target == "restart":
            restart_type = parsed
        elif spec.target == "task":
            pipeline.task_cancellation_timeout = float(parsed)
        elif spec.target == "pipeline":
            if parsed < 1:
                raise ConfigError(f"{key}: must be an integer >= 1 (got {parsed})")
            graph[spec.field] = parsed
        else:
            restart_fields[spec.target][spec.field] = parsed
    if checkpoint or storage_options:
        current = pipeline.checkpoint.model_dump()
        current["storage_options"] = {**current["storage_options"], **storage_options}
        pipeline.checkpoint = CheckpointConfig(**{**current, **checkpoint})
    if state:
        pipeline.state_backend = StateBackendConfig(**{**pipeline.state_backend.model_dump(), **state})
    pipeline.restart = _restart(pipeline.restart, restart_type, restart_fields)
    for field, n in graph.items():
        setattr(pipeline.graph, field, n)
    return pipeline
