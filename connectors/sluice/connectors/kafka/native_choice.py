"""Which of the Kafka source's readers runs (:mod:`.native_reader` has the native one): the source's
``reader`` option, and for ``"auto"`` whether the native extension is built and can take the consumer
settings. Imports nothing of the source's options (which ask it at build time)."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from sluice.errors import ConfigError

_native: Any
try:  # by name: a ``from sluice.connectors.kafka import`` would import the package, which imports the options
    _native = importlib.import_module("sluice.connectors.kafka._native")
    _MISSING: str | None = None
except ImportError as exc:  # not built (no Rust toolchain when it was installed)
    _native = None
    _MISSING = f"the extension sluice.connectors.kafka._native is not built ({exc})"

__all__ = ["CALLBACKS", "choose_reader", "extension", "native_problem", "settings"]

#: confluent-kafka's callback settings the native consumer serves
CALLBACKS = ("on_commit", "error_cb", "stats_cb", "logger")

_problems: dict[int, tuple[Any, str | None]] = {}
_lock = threading.Lock()


class _Options(Protocol):
    """What of ``KafkaSourceOptions`` the choice reads."""

    @property
    def name(self) -> str: ...
    @property
    def reader(self) -> str: ...
    @property
    def bounded(self) -> bool: ...
    def consumer_conf(self, default_group: str, *, bounded: bool, reader: bool = False) -> dict[str, Any]: ...


def extension() -> Any:
    """The extension module (None where it is not built)."""
    return _native


def settings(conf: Mapping[str, Any]) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """librdkafka settings as strings, and the callbacks; ValueError for what the native consumer
    cannot take (a callback it does not serve)."""
    out: list[tuple[str, str]] = []
    callbacks: dict[str, Any] = {}
    for key, value in conf.items():
        if key in CALLBACKS:
            callbacks[key] = value
        elif callable(value):
            raise ValueError(f"consumer_config[{key!r}] is a callback the native reader does not serve")
        elif isinstance(value, bool):
            out.append((key, "true" if value else "false"))
        else:
            out.append((key, str(value)))
    return out, callbacks


def native_problem(options: _Options) -> str | None:
    """Why the native reader cannot read this source (None: it can); asked once per options object."""
    if _native is None:
        return _MISSING
    with _lock:
        known = _problems.get(id(options))
        if known is not None and known[0] is options:
            return known[1]
    problem: str | None = None
    try:
        conf, _ = settings(options.consumer_conf("sluice-probe", bounded=options.bounded, reader=True))
        _native.Consumer(conf).close()  # librdkafka checks names and values here (no network)
    except ValueError as exc:
        problem = str(exc)
    except _native.KafkaNativeError as exc:
        problem = f"librdkafka of the native reader refuses consumer_config: {exc.args[1]}"
    with _lock:
        _problems[id(options)] = (options, problem)
    return problem


def choose_reader(options: _Options) -> tuple[str, str]:
    """``("native" | "python", why)`` for this source in this process; ConfigError when ``reader="native"``
    is asked for and cannot run."""
    want = options.reader
    if want == "python":
        return "python", "reader='python'"
    problem = native_problem(options)
    if problem is None:
        version = getattr(_native, "librdkafka_version", "?")
        return "native", f"librdkafka {version}, fetch and decoding without the GIL"
    if want == "native":
        raise ConfigError(f"KafkaSource {options.name!r}: reader='native' cannot run: {problem}")
    return "python", f"the native reader cannot run: {problem}"
