"""Validated, frozen configuration objects.

Every configuration object is checked when it is created (that is, when the job is built); a wrong value
raises :class:`~sluice.errors.ConfigError` naming the option and what is allowed. Here: the checkpoint
and restart options; :mod:`sluice.config.checkpoint_key` resolves the checkpoint key,
:class:`sluice.config.job.JobConfig` is how a job runs.
"""

from __future__ import annotations

import difflib
import re
import time
from collections import deque
from typing import Any, Literal

import tenacity
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sluice.config.checkpoint_key import MIN_KEY_LENGTH, resolve_key
from sluice.durations import to_seconds
from sluice.errors import ConfigError
from sluice.events import AlignmentMode, CheckpointKind, CheckpointOptions

__all__ = [
    "CheckpointConfig",
    "ExponentialBackoffRestart",
    "FailureRateRestart",
    "FixedDelayRestart",
    "NoRestart",
    "RestartStrategy",
    "validated",
]


def _describe(model: type[BaseModel], err: dict[str, Any]) -> str:
    """One validation error in words: the option, what it must be, what it got; an unknown option or a value
    not among the allowed ones with the closest allowed one (did you mean) and the others."""
    loc = ".".join(str(x) for x in err.get("loc", ())) or "(value)"
    kind = err.get("type")
    if kind == "extra_forbidden":
        allowed = [f.alias or name for name, f in model.model_fields.items()]
        near = difflib.get_close_matches(loc, allowed, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        return f"unknown option {loc!r} ({hint}allowed: {', '.join(allowed)})"
    if kind == "literal_error" and "input" in err:
        values = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
        near = difflib.get_close_matches(str(err["input"]), values, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        return f"{loc}: {err['input']!r} is not allowed ({hint}allowed: {', '.join(map(repr, values))})"
    msg = str(err.get("msg", "invalid"))
    msg = re.sub(r"^Input should be ", "must be ", msg)
    msg = msg.replace(", unable to parse string as a number", "").replace(", unable to interpret input", "")
    if "input" in err and kind != "missing":
        return f"{loc}: {msg} (got {err['input']!r})"
    return f"{loc}: {msg}"


class _Frozen(BaseModel):
    """Base for configuration: frozen, no unknown options, errors as ConfigError."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            for e in exc.errors():
                if isinstance(e.get("ctx", {}).get("error"), ConfigError):
                    raise e["ctx"]["error"] from None
            lines = "; ".join(_describe(type(self), dict(e)) for e in exc.errors())
            raise ConfigError(f"invalid {type(self).__name__}: {lines}") from None


def _duration(model: str, value: Any, info: ValidationInfo) -> Any:
    """A duration option of ``model`` as seconds (:mod:`sluice.durations`); None passes (the model's own
    check says whether None is allowed). The range is checked by the model, in its own words."""
    if value is None:
        return None
    return to_seconds(value, f"{model}({info.field_name})", sign="any")


def validated(model: type[_Frozen], value: Any, option: str) -> Any:
    """Return ``value`` if it is a ``model`` instance, or build one from a dict, naming ``option`` on error."""
    if isinstance(value, model):
        return value
    if isinstance(value, dict):
        return model(**value)
    raise ConfigError(f"{option}: expected a {model.__name__} or a dict, got {type(value).__name__}")


class CheckpointConfig(_Frozen):
    """How and how often the job takes checkpoints.

    Durations are :mod:`sluice.durations`: ``"30 s"``, ``"1 min"``, a timedelta, or a number of seconds.

    Attributes:
        interval: time between checkpoint triggers; ``None`` disables periodic checkpoints (a bounded
            job still takes its final checkpoint).
        mode: ``"exactly_once"`` (barriers are aligned) or ``"at_least_once"`` (never blocks; replays may
            duplicate records downstream).
        timeout: time after which a pending checkpoint is aborted.
        min_pause: minimum time between the end of one checkpoint and the trigger of the next.
        max_concurrent: checkpoints in flight at once.
        tolerable_failed_checkpoints: consecutive failed checkpoints tolerated before the job fails.
        num_retained: completed checkpoints kept; older ones are deleted once subsumed.
        history_size: checkpoints whose statistics are kept (Flink's ``web.checkpoints.history``): in
            memory for the control endpoint, the dashboard and ``JobResult.checkpoints``, and in the
            checkpoint folder (``_stats/``) for ``sluice checkpoints list|show``; older ones are trimmed,
            so a job that runs for weeks keeps a bounded history (totals count every checkpoint).
        retain_on_cancel: keep the retained checkpoints when the job is cancelled.
        storage: where checkpoints are written: a local path, ``file://`` or ``s3://`` URI.
        storage_options: options for the storage (for ``s3://``: endpoint_url, region_name, credentials).
        unaligned: barriers overtake in-flight data, which is persisted as channel state.
        aligned_checkpoint_timeout: a duration; start aligned and switch to unaligned once alignment takes longer.
        key: the secret that signs every checkpoint file (HMAC-SHA256, at least 16 characters); a restore
            refuses files it did not sign. None: ``$SLUICE_CHECKPOINT_KEY``, else the user's key file
            ``~/.config/sluice/checkpoint.key`` (created, mode 0600). Restoring a savepoint on another host
            needs the same key (docs/security.md). Never shown or logged.
        storage_retry_timeout: how long a checkpoint storage operation is retried (with backoff) while it
            fails transiently (an I/O error, a timeout, an S3 connection failure, throttling or 5xx);
            0 tries once. A longer outage fails the checkpoint (or the attempt, which then restarts).
    """

    interval: float | None = 10.0
    mode: Literal["exactly_once", "at_least_once"] = "exactly_once"
    timeout: float = 600.0
    min_pause: float = 0.0
    max_concurrent: int = 1
    tolerable_failed_checkpoints: int = 0
    num_retained: int = 1
    history_size: int = 100
    retain_on_cancel: bool = True
    storage: str = "./checkpoints"
    unaligned: bool = False
    aligned_checkpoint_timeout: float | None = None
    storage_options: dict[str, Any] = Field(default_factory=dict, repr=False)  # may hold credentials
    key: SecretStr | None = Field(default=None, repr=False)
    storage_retry_timeout: float = 30.0

    @field_validator("interval", "timeout", "min_pause", "aligned_checkpoint_timeout", "storage_retry_timeout", mode="before")
    @classmethod
    def _durations(cls, value: Any, info: ValidationInfo) -> Any:
        return _duration("CheckpointConfig", value, info)

    @model_validator(mode="after")
    def _check(self) -> CheckpointConfig:
        def bad(option: str, allowed: str, got: Any) -> ConfigError:
            return ConfigError(f"invalid CheckpointConfig: {option} must be {allowed} (got {got!r})")

        if self.interval is not None and not self.interval > 0:
            raise bad(
                "interval", "a duration > 0 ('30 s', a timedelta, seconds), or None to disable periodic checkpoints", self.interval
            )
        if not self.timeout > 0:
            raise bad("timeout", "a duration > 0", self.timeout)
        if self.min_pause < 0:
            raise bad("min_pause", "a duration >= 0", self.min_pause)
        if self.max_concurrent < 1:
            raise bad("max_concurrent", "an integer >= 1", self.max_concurrent)
        if self.tolerable_failed_checkpoints < 0:
            raise bad("tolerable_failed_checkpoints", "an integer >= 0", self.tolerable_failed_checkpoints)
        if self.num_retained < 1:
            raise bad("num_retained", "an integer >= 1", self.num_retained)
        if self.history_size < 1:
            raise bad("history_size", "an integer >= 1", self.history_size)
        if not 0 <= self.storage_retry_timeout < float("inf"):
            raise bad("storage_retry_timeout", "a finite duration >= 0", self.storage_retry_timeout)
        if not self.storage:
            raise bad("storage", "a local path, file:// or s3:// URI", self.storage)
        scheme = self.storage.split("://", 1)[0] if "://" in self.storage else "file"
        if scheme not in ("file", "s3"):
            raise bad("storage", "a local path, file:// or s3:// URI", self.storage)
        if self.aligned_checkpoint_timeout is not None and self.aligned_checkpoint_timeout < 0:
            raise bad(
                "aligned_checkpoint_timeout",
                "a duration >= 0, or None",
                self.aligned_checkpoint_timeout,
            )
        if self.key is not None and len(self.key.get_secret_value().strip()) < MIN_KEY_LENGTH:
            raise ConfigError(
                f"invalid CheckpointConfig: key must have at least {MIN_KEY_LENGTH} characters (or None: "
                "$SLUICE_CHECKPOINT_KEY, else the user's key file)"
            )
        if (self.unaligned or self.aligned_checkpoint_timeout is not None) and self.mode != "exactly_once":
            raise bad("mode", "'exactly_once' when unaligned or aligned_checkpoint_timeout is set", self.mode)
        return self

    def resolved_key(self) -> bytes:
        """The checkpoint key: ``key``, else ``$SLUICE_CHECKPOINT_KEY``, else the user's key file (created if
        missing; see :mod:`sluice.config.checkpoint_key`)."""
        return resolve_key(self.key.get_secret_value() if self.key is not None else None)

    def with_resolved_key(self) -> CheckpointConfig:
        """This configuration with its key resolved (on the driver), so that it travels with the job."""
        if self.key is not None:
            return self
        return self.model_copy(update={"key": SecretStr(self.resolved_key().decode())})

    def options(self, savepoint: bool = False) -> CheckpointOptions:
        """The options a checkpoint's barriers carry: its kind and how tasks align (savepoints align)."""
        if savepoint:
            return CheckpointOptions(CheckpointKind.SAVEPOINT, AlignmentMode.ALIGNED)
        if self.mode == "at_least_once":
            return CheckpointOptions(alignment=AlignmentMode.AT_LEAST_ONCE)
        if self.aligned_checkpoint_timeout is not None:
            return CheckpointOptions(
                alignment=AlignmentMode.ADAPTIVE, alignment_timeout=self.aligned_checkpoint_timeout
            )
        if self.unaligned:
            return CheckpointOptions(alignment=AlignmentMode.UNALIGNED)
        return CheckpointOptions()


class RestartStrategy(_Frozen):
    """How the job fails over after a task failure. Built on tenacity's stop and wait strategies."""

    def stop(self) -> Any:
        """The tenacity stop condition: when it is true, the job fails with the root cause."""
        raise NotImplementedError

    def wait(self) -> Any:
        """The tenacity wait strategy: the delay before the next restart."""
        raise NotImplementedError

    def retrying(self, retry_on: type[BaseException] | tuple[type[BaseException], ...]) -> tenacity.Retrying:
        """A tenacity ``Retrying`` that restarts on ``retry_on`` and re-raises the last failure at the end."""
        return tenacity.Retrying(
            stop=self.stop(),
            wait=self.wait(),
            retry=tenacity.retry_if_exception_type(retry_on),
            reraise=True,
        )


class NoRestart(RestartStrategy):
    """Fail the job at the first task failure."""

    def stop(self) -> Any:
        return tenacity.stop_after_attempt(1)

    def wait(self) -> Any:
        return tenacity.wait_none()


class FixedDelayRestart(RestartStrategy):
    """Restart up to ``attempts`` times, waiting ``delay`` seconds before each restart."""

    attempts: int = 3
    delay: float = 1.0

    @field_validator("delay", mode="before")
    @classmethod
    def _durations(cls, value: Any, info: ValidationInfo) -> Any:
        return _duration("FixedDelayRestart", value, info)

    @model_validator(mode="after")
    def _check(self) -> FixedDelayRestart:
        if self.attempts < 0:
            raise ConfigError(
                f"invalid FixedDelayRestart: attempts must be an integer >= 0 (got {self.attempts})"
            )
        if self.delay < 0:
            raise ConfigError(f"invalid FixedDelayRestart: delay must be a duration >= 0 (got {self.delay})")
        return self

    def stop(self) -> Any:
        return tenacity.stop_after_attempt(self.attempts + 1)

    def wait(self) -> Any:
        return tenacity.wait_fixed(self.delay)


class ExponentialBackoffRestart(RestartStrategy):
    """Restart with exponentially growing delays (``initial`` * ``multiplier``^n, capped at ``max_delay``).

    ``jitter`` adds up to that many seconds of random delay; ``max_attempts`` of ``None`` means unlimited.
    """

    initial: float = 1.0
    max_delay: float = 300.0
    multiplier: float = 2.0
    jitter: float = 0.0
    max_attempts: int | None = None

    @field_validator("initial", "max_delay", "jitter", mode="before")
    @classmethod
    def _durations(cls, value: Any, info: ValidationInfo) -> Any:
        return _duration("ExponentialBackoffRestart", value, info)

    @model_validator(mode="after")
    def _check(self) -> ExponentialBackoffRestart:
        if self.initial < 0 or self.max_delay < self.initial:
            raise ConfigError(
                "invalid ExponentialBackoffRestart: need 0 <= initial <= max_delay "
                f"(got initial={self.initial}, max_delay={self.max_delay})"
            )
        if self.multiplier < 1:
            raise ConfigError(
                f"invalid ExponentialBackoffRestart: multiplier must be >= 1 (got {self.multiplier})"
            )
        if self.max_attempts is not None and self.max_attempts < 0:
            raise ConfigError(
                f"invalid ExponentialBackoffRestart: max_attempts must be >= 0 or None (got {self.max_attempts})"
            )
        return self

    def stop(self) -> Any:
        if self.max_attempts is None:
            return tenacity.stop_never
        return tenacity.stop_after_attempt(self.max_attempts + 1)

    def wait(self) -> Any:
        base = tenacity.wait_exponential(
            multiplier=self.initial, exp_base=self.multiplier, max=self.max_delay
        )
        return base + tenacity.wait_random(0, self.jitter) if self.jitter else base


class _StopOnFailureRate:
    """tenacity stop condition: stop once more than ``max_failures`` failed within ``window`` seconds."""

    def __init__(self, max_failures: int, window: float) -> None:
        self.max_failures = max_failures
        self.window = window
        self._times: deque[float] = deque()

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        now = time.monotonic()
        self._times.append(now)
        while self._times and now - self._times[0] > self.window:
            self._times.popleft()
        return len(self._times) > self.max_failures


class FailureRateRestart(RestartStrategy):
    """Restart unless more than ``max_failures`` failures happened within ``interval`` seconds."""

    max_failures: int = 3
    interval: float = 60.0
    delay: float = 1.0

    @field_validator("interval", "delay", mode="before")
    @classmethod
    def _durations(cls, value: Any, info: ValidationInfo) -> Any:
        return _duration("FailureRateRestart", value, info)

    @model_validator(mode="after")
    def _check(self) -> FailureRateRestart:
        if self.max_failures < 0 or self.interval <= 0 or self.delay < 0:
            raise ConfigError(
                "invalid FailureRateRestart: need max_failures >= 0, interval > 0, delay >= 0 "
                f"(got {self.max_failures}, {self.interval}, {self.delay})"
            )
        return self

    def stop(self) -> Any:
        return _StopOnFailureRate(self.max_failures, self.interval)

    def wait(self) -> Any:
        return tenacity.wait_fixed(self.delay)
