"""Package discovery over the source roots, and the native Kafka reader; everything else is in pyproject.toml.

Each top-level folder is a source root whose paths are module paths (``core/sluice/api.py`` is
``sluice.api``, ``connectors/sluice/connectors/kafka/`` is ``sluice.connectors.kafka``): the layout Apache
Airflow uses for its provider folders. Subpackages are discovered, so a new one cannot be missing from the
wheel (``tests/test_packaging.py`` builds the wheel and imports every module from it).

``native/`` is a Rust crate (PyO3, abi3) built by setuptools-rust into ``sluice.connectors.kafka._native``:
the Kafka read path without the GIL (``connectors/sluice/connectors/kafka/native_reader.py``). It is
optional: where no ``cargo`` is on the PATH or the build fails, the install goes on without it (a
pure-Python wheel when there is no cargo) and the Kafka source uses its Python reader (``reader="auto"``). ``SLUICE_NATIVE=0`` skips the build;
``SLUICE_NATIVE_FEATURES`` adds Cargo features (``ssl``: librdkafka with the system's OpenSSL).
"""

import os
import shutil

from setuptools import find_packages, setup

ROOTS = {
    "sluice": "core/sluice",
    "sluice.connectors": "connectors/sluice/connectors",
    "sluice.sinks": "sinks/sluice/sinks",
    "sluice.templates": "templates/sluice/templates",
}


def rust_extensions() -> list:
    if os.environ.get("SLUICE_NATIVE", "1") == "0" or shutil.which("cargo") is None:
        return []  # a pure-Python wheel: the Kafka source takes its Python reader
    from setuptools_rust import Binding, RustExtension

    features = [f for f in os.environ.get("SLUICE_NATIVE_FEATURES", "").replace(",", " ").split() if f]
    return [
        RustExtension(
            "sluice.connectors.kafka._native",
            path="native/Cargo.toml",
            binding=Binding.PyO3,
            py_limited_api=True,
            features=features,
            optional=True,
            debug=False,
        )
    ]


RUST = rust_extensions()

setup(
    package_dir=ROOTS,
    packages=[f"{root}{'.' + sub if sub else ''}" for root, path in ROOTS.items() for sub in ["", *find_packages(path)]],
    rust_extensions=RUST,
    # the extension uses CPython's stable ABI (abi3, >= 3.11): one wheel per platform
    options={"bdist_wheel": {"py_limited_api": "cp311"}} if RUST else {},
    zip_safe=False,
)
