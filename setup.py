"""Package discovery over the source roots; everything else is in pyproject.toml.

Each top-level folder is a source root whose paths are module paths (``core/sluice/api.py`` is
``sluice.api``, ``connectors/sluice/connectors/kafka/`` is ``sluice.connectors.kafka``): the layout Apache
Airflow uses for its provider folders. Subpackages are discovered, so a new one cannot be missing from the
wheel (``tests/test_packaging.py`` builds the wheel and imports every module from it).
"""

from setuptools import find_packages, setup

ROOTS = {
    "sluice": "core/sluice",
    "sluice.connectors": "connectors/sluice/connectors",
    "sluice.sinks": "sinks/sluice/sinks",
    "sluice.templates": "templates/sluice/templates",
}

setup(
    package_dir=ROOTS,
    packages=[f"{root}{'.' + sub if sub else ''}" for root, path in ROOTS.items() for sub in ["", *find_packages(path)]],
)
