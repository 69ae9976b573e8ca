"""Rendering of ``sluice new``: job files and plugin packages from Jinja templates in ``sluice.templates``.

* Job templates (``<name>.py.j2``): one file, ``<directory>/<name>.py``, whose connection settings come
  from environment variables.
* Plugin templates (``plugins/<kind>/``): a package folder ``<directory>/<name>/`` with a pyproject that
  registers the connector in its entry-point group, a working connector skeleton, tests that run the
  conformance kit (``sluice.testing.conformance``) on it, and a README.

Jinja renders; the generated code belongs to its author from then on (see docs/connectors.md for why not
copier).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2

from sluice import __version__
from sluice.errors import ConfigError

__all__ = [
    "NAME_RULE",
    "PLUGIN_TEMPLATES",
    "Template",
    "available_templates",
    "check_name",
    "describe_templates",
    "render_template",
]

#: what a job or plugin name may be (one rule for both): words of letters and digits joined by ``-`` or
#: ``_``, starting with a letter. A job ``my-job`` is written to ``my_job.py`` (a module name); a plugin
#: ``my_plugin`` to the package ``my-plugin/`` (a distribution name, normalized as PEP 503 does)
NAME_RULE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+)*")

#: sluice's own distribution: no plugin may be published under it
_OWN_DISTRIBUTION = "sluice-etl"

#: plugin template -> (what it makes, {path in the package: template file})
PLUGIN_TEMPLATES: dict[str, tuple[str, dict[str, str]]] = {
    kind: (
        f"a {kind} plugin package: pyproject with the sluice.{'connectors' if kind == 'source' else 'sinks'} "
        f"entry point, a working {kind} skeleton, conformance-kit tests, README",
        {
            "pyproject.toml": "pyproject.toml.j2",
            "README.md": "README.md.j2",
            "src/{package}/__init__.py": "__init__.py.j2",
            f"src/{{package}}/{kind}.py": f"{kind}.py.j2",
            f"tests/test_{kind}.py": f"test_{kind}.py.j2",
        },
    )
    for kind in ("source", "sink")
}


@dataclass(frozen=True)
class Template:
    """A template of ``sluice new``: ``kind`` is ``"job"`` (one file) or ``"plugin"`` (a package)."""

    name: str
    kind: str
    description: str


def _root() -> resources.abc.Traversable:
    return resources.files("sluice.templates")


def _job_description(path: resources.abc.Traversable) -> str:
    first = path.read_text().split('"""', 2)[1].strip().splitlines()[0]
    return first.split(":", 1)[1].strip() if ":" in first else first


def describe_templates() -> list[Template]:
    """Every template, jobs first."""
    jobs = [
        Template(p.name.removesuffix(".py.j2"), "job", _job_description(p))
        for p in sorted(_root().iterdir(), key=lambda p: p.name)
        if p.name.endswith(".py.j2")
    ]
    return jobs + [Template(k, "plugin", d) for k, (d, _) in sorted(PLUGIN_TEMPLATES.items())]


def available_templates() -> list[str]:
    return sorted(t.name for t in describe_templates())


def _environment(folder: resources.abc.Traversable) -> jinja2.Environment:
    loader = jinja2.FunctionLoader(lambda n: folder.joinpath(n).read_text())
    return jinja2.Environment(loader=loader, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


def render_template(template: str, name: str, directory: str = ".") -> Path:
    """Write ``<directory>/<name>.py`` (a job template) or the package ``<directory>/<name>/`` (a plugin
    template); refuses to overwrite. Returns what it wrote."""
    names = available_templates()
    if template not in names:
        raise ConfigError(f"template: {template!r} is not a template (allowed: {', '.join(names)})")
    check_name(name)
    if template in PLUGIN_TEMPLATES:
        return _render_plugin(template, name, Path(directory))
    text = _environment(_root()).get_template(f"{template}.py.j2").render(name=name, module=name.replace("-", "_"))
    path = Path(directory) / f"{name.replace('-', '_')}.py"
    if path.exists():
        raise ConfigError(f"{path} exists: pick another name or directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def check_name(name: str) -> None:
    """Refuse a job or plugin name that :data:`NAME_RULE` does not allow.

    Raises:
        ConfigError: naming the rule, with an example.
    """
    if not NAME_RULE.fullmatch(name):
        raise ConfigError(
            f"name: {name!r} must be words of letters and digits joined by - or _, starting with a letter "
            "(e.g. orders-to-parquet, http_poll)"
        )


def _render_plugin(kind: str, name: str, directory: Path) -> Path:
    name = re.sub(r"[-_]+", "-", name).lower()  # the distribution's normalized name (PEP 503)
    base = name.removeprefix("sluice-")
    if f"sluice-{base}" == _OWN_DISTRIBUTION:
        raise ConfigError(
            f"name: {name!r} would publish the plugin as {_OWN_DISTRIBUTION}, sluice's own distribution: "
            "pick another name"
        )
    words = base.split("-")
    context = {
        "name": base,
        "distribution": f"sluice-{base}",
        "package": "sluice_" + "_".join(words),
        "cls": "".join(w.capitalize() for w in words) + kind.capitalize(),
        "title": " ".join(words).capitalize() + f" {kind}",
        "sluice_version": __version__,
    }
    root = directory / name
    if root.exists():
        raise ConfigError(f"{root} exists: pick another name or directory")
    env = _environment(_root().joinpath("plugins", kind))
    for target, source in PLUGIN_TEMPLATES[kind][1].items():
        path = root / target.format(package=context["package"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(env.get_template(source).render(**context))
    return root
