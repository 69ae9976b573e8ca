"""Loading a job file for ``sluice run``, and what its author sees when the file itself is wrong.

A misspelled keyword argument (``KafkaSource(bootstrap_server=...)``) is one line naming the file and
line, the callable, the wrong keyword, the closest allowed one and the others. Any other exception the
file raises shows the traceback of the job file's own frames, not of runpy and click (``sluice -v`` shows
all of it). A syntax error is one line: ``file:line:column: message: the line``; so is a wrong option
found while the file builds its pipeline (``job.py:5: invalid CheckpointConfig: unknown option ...``).
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import runpy
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import click

from sluice.api import Pipeline
from sluice.errors import ConfigError, GraphError, SluiceError

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


def load_pipeline(path: str, launched: Callable[[], bool] = lambda: False) -> Pipeline | None:
    """Load a job file: run it as ``__main__`` (as ``python job.py`` would) and find its pipeline.

    The pipeline is ``pipeline``, what ``build_pipeline()`` returns, or the one :class:`Pipeline` the file's
    top level holds, whatever its name; None if the file ran its pipeline itself (``p.run()``, handed to
    ``sluice run``: ``launched()`` says so).

    Raises:
        ConfigError: a call in the file has a keyword argument its callee does not take (one line).
        click.ClickException: the file has a syntax error (one line: file:line: message), or defines no
            pipeline (or several, naming them) and ran none.
        JobFileError: the file raised something else (printed with its own frames' traceback).
    """
    if not Path(path).is_file():
        raise click.BadParameter(f"no such job file: {path}", param_hint="JOB")
    ctx = click.get_current_context(silent=True)
    verbose = bool(ctx is not None and ctx.meta.get("sluice.verbose"))
    argv = sys.argv
    sys.argv = [path]  # what the file sees as `python job.py` would give it
    try:
        ns = runpy.run_path(path, run_name="__main__")
        if launched():
            return None  # the file ran its pipeline(s) itself
        if isinstance(ns.get("pipeline"), Pipeline):
            return ns["pipeline"]  # type: ignore[no-any-return]
        p = ns["build_pipeline"]() if callable(ns.get("build_pipeline")) else None
    except (ConfigError, GraphError) as exc:
        if getattr(exc, "launched", False) or verbose:
            raise  # the job ran and failed (its own one line), or -v: as it is
        _, where = _call_site(exc, path)
        raise click.ClickException(f"{where}: {' '.join(str(exc).split())}") from exc
    except (SluiceError, click.ClickException, SystemExit, KeyboardInterrupt):
        raise
    except SyntaxError as exc:
        if verbose:
            raise JobFileError(path, exc, verbose) from exc
        raise click.ClickException(_syntax_line(exc, path)) from None
    except TypeError as exc:
        raise (keyword_error(exc, path) or JobFileError(path, exc, verbose)) from exc
    except Exception as exc:
        raise JobFileError(path, exc, verbose) from exc
    finally:
        sys.argv = argv
    if isinstance(p, Pipeline):
        return p
    found = [name for name, value in ns.items() if isinstance(value, Pipeline) and not name.startswith("_")]
    if len(found) == 1:
        return ns[found[0]]  # type: ignore[no-any-return]
    if found:
        raise click.ClickException(
            f"{path} defines several pipelines ({', '.join(found)}): name the one to run `pipeline`, or call "
            "its run() in the file"
        )
    raise click.ClickException(
        f"{path} defines no pipeline: make one with `Pipeline(...)` at the top level (any name), "
        "`build_pipeline() -> Pipeline`, or call its run() in the file"
    )


def _syntax_line(exc: SyntaxError, path: str) -> str:
    """``file:line[:col]: message`` (and the offending line) for a syntax error of the job file."""
    where = f"{path}:{exc.lineno}" + (f":{exc.offset}" if exc.offset else "") if exc.lineno else path
    text = (exc.text or "").strip()
    return f"{where}: {type(exc).__name__}: {exc.msg}" + (f": {text}" if text else "")
