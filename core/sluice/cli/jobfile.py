"""Loading a job file for ``sluice run``, and what its author sees when the file itself is wrong.

A misspelled keyword argument (``KafkaSource(bootstrap_server=...)``) is one line naming the file and
line, the callable, the wrong keyword, the closest allowed one and the others. Any other exception the
file raises shows the traceback of the job file's own frames, not of runpy and click (``sluice -v`` shows
all of it).
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import runpy
import traceback
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import click

from sluice.api import Pipeline
from sluice.errors import ConfigError, SluiceError

__all__ = ["JobFileError", "keyword_error", "load_pipeline"]

_UNEXPECTED = re.compile(r"^(?P<callee>[\w.<>]+)\(\) got an unexpected keyword argument '(?P<kw>\w+)'")


class JobFileError(click.ClickException):
    """The job file raised while it was loaded; its traceback (the file's own frames) is printed first."""

    def __init__(self, path: str, exc: BaseException, verbose: bool) -> None:
        super().__init__(f"{path} failed while loading: {type(exc).__name__}: {exc}")
        self.lines = traceback.format_exception(type(exc), exc, exc.__traceback__ if verbose else _from_job(exc, path))

    def show(self, file: Any = None) -> None:
        click.echo("".join(self.lines).rstrip(), err=True)
        super().show(file)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _from_job(exc: BaseException, path: str) -> TracebackType | None:
    """``exc``'s traceback from the first frame in the job file on (runpy's and click's frames cut)."""
    tb = exc.__traceback__
    while tb is not None and not _same_file(tb.tb_frame.f_code.co_filename, path):
        tb = tb.tb_next
    return tb or exc.__traceback__


def _call_site(exc: BaseException, path: str) -> tuple[FrameType | None, str]:
    """The frame that made the failing call (the traceback's last), and ``file:line`` in the job file."""
    frame, where, tb = None, path, exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if _same_file(frame.f_code.co_filename, path):
            where = f"{path}:{tb.tb_lineno}"
        tb = tb.tb_next
    return frame, where


def _resolve(callee: str, frame: FrameType | None) -> Any:
    """The object a qualified name like ``KafkaSource.__init__`` names, looked up in ``frame``'s scope."""
    if frame is None:
        return None
    head, *rest = callee.split(".")
    scope = {**frame.f_builtins, **frame.f_globals, **frame.f_locals}
    obj = scope.get(head)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj


def keyword_error(exc: TypeError, path: str) -> ConfigError | None:
    """A one-line :class:`ConfigError` for an unexpected keyword argument in job file ``path``, or None if
    ``exc`` is another TypeError."""
    m = _UNEXPECTED.match(str(exc))
    if m is None:
        return None
    callee, keyword = m["callee"], m["kw"]
    frame, where = _call_site(exc, path)
    name = callee.removesuffix(".__init__")
    allowed: list[str] = []
    try:
        params = inspect.signature(_resolve(callee, frame)).parameters.values()
        keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        allowed = [p.name for p in params if p.kind in keywords and p.name not in ("self", "cls")]
    except (TypeError, ValueError):
        pass  # not resolvable from the call site: say what is known
    text = f"{where}: {name} has no keyword argument {keyword!r}"
    if allowed:
        close = difflib.get_close_matches(keyword, allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        text += f" ({hint}allowed: {', '.join(allowed)})"
    return ConfigError(text)


def load_pipeline(path: str) -> Pipeline:
    """Load a job file: it defines ``pipeline`` (a Pipeline) or ``build_pipeline() -> Pipeline``.

    Raises:
        ConfigError: a call in the file has a keyword argument its callee does not take (one line).
        JobFileError: the file raised something else (printed with its own frames' traceback).
    """
    if not Path(path).is_file():
        raise click.BadParameter(f"no such job file: {path}", param_hint="JOB")
    ctx = click.get_current_context(silent=True)
    verbose = bool(ctx is not None and ctx.meta.get("sluice.verbose"))
    try:
        ns = runpy.run_path(path, run_name="__sluice_job__")
        if isinstance(ns.get("pipeline"), Pipeline):
            return ns["pipeline"]  # type: ignore[no-any-return]
        p = ns["build_pipeline"]() if callable(ns.get("build_pipeline")) else None
    except (SluiceError, click.ClickException, SystemExit, KeyboardInterrupt):
        raise
    except TypeError as exc:
        raise (keyword_error(exc, path) or JobFileError(path, exc, verbose)) from exc
    except Exception as exc:
        raise JobFileError(path, exc, verbose) from exc
    if isinstance(p, Pipeline):
        return p
    raise click.ClickException(
        f"{path} defines neither `pipeline = Pipeline(...)` nor `build_pipeline() -> Pipeline`"
    )
