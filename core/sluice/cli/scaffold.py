"""Rendering of `sluice new`: job files from Jinja templates shipped in ``sluice.templates``."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import jinja2

from sluice.errors import ConfigError

__all__ = ["available_templates", "render_template"]


def available_templates() -> list[str]:
    root = resources.files("sluice.templates")
    return sorted(p.name.removesuffix(".py.j2") for p in root.iterdir() if p.name.endswith(".py.j2"))


def render_template(template: str, name: str, directory: str = ".") -> Path:
    """Write ``<directory>/<name>.py`` from ``template``; refuses to overwrite."""
    names = available_templates()
    if template not in names:
        raise ConfigError(f"template: {template!r} is not a template (allowed: {', '.join(names)})")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name):
        raise ConfigError(f"name: {name!r} must be a job name of letters, digits, - and _")
    loader = jinja2.FunctionLoader(lambda n: resources.files("sluice.templates").joinpath(n).read_text())
    env = jinja2.Environment(loader=loader, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    text = env.get_template(f"{template}.py.j2").render(name=name, module=name.replace("-", "_"))
    path = Path(directory) / f"{name.replace('-', '_')}.py"
    if path.exists():
        raise ConfigError(f"{path} exists: pick another name or directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
