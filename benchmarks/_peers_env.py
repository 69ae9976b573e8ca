"""What benchmarks/peers.py needs of the peers, installed on first use and cached: a venv per peer (each pins
packages the project's own venv must not take: PyFlink pins old pyarrow/numpy/pandas, Quix Streams
confluent-kafka < 2.13, the Spark peer a pyspark whose Kafka connector is on Maven Central) and the peers'
jars, resolved by Maven through ``maven_classpath`` of tests/apache_kafka_jars.py (the code that resolves the
Apache Kafka broker's jars).

Everything lives under ``~/.cache/sluice-bench/`` (``$XDG_CACHE_HOME`` if set); ``python
benchmarks/peers.py --install`` fills it and exits. Nothing of the peers is committed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.apache_kafka_jars import maven_classpath

__all__ = ["FLINK", "QUIX", "SPARK", "VERSIONS", "Peer", "cache_root", "install"]

#: PyFlink, the newest on the package index whose SQL formats Maven Central serves: flink-sql-parquet is
#: published for 2.3.0 (not for 2.2.x); the newest Kafka SQL connector, 5.0.0-2.2 (built against 2.2),
#: runs on it
FLINK_VERSION = "2.3.0"
FLINK_KAFKA_CONNECTOR = "5.0.0-2.2"
#: Flink's Parquet format needs Hadoop's classes (its docs: "add Hadoop dependencies"); the shaded client
HADOOP_VERSION = "3.4.1"
#: the Spark peer: the newest pyspark whose spark-sql-kafka-0-10 Maven Central serves (the project's own
#: pyspark, which sluice's Spark runtime uses, may be newer)
SPARK_VERSION = "4.2.0"
QUIX_VERSION = "3.28.1"
VERSIONS = {"apache-flink": FLINK_VERSION, "flink-sql-connector-kafka": FLINK_KAFKA_CONNECTOR,
            "flink-sql-parquet": FLINK_VERSION, "hadoop-client": HADOOP_VERSION, "pyspark (peer)": SPARK_VERSION,
            "spark-sql-kafka-0-10_2.13": SPARK_VERSION, "quixstreams": QUIX_VERSION}  # fmt: skip


def _dep(group: str, artifact: str, version: str, transitive: bool = True) -> str:
    excl = "" if transitive else "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>"
    return (f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version>{excl}</dependency>")  # fmt: skip


def _pom(name: str, deps: list[str]) -> str:
    return (f'<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            f"<groupId>sluice.bench</groupId><artifactId>{name}</artifactId><version>1</version>"
            f"<packaging>pom</packaging><dependencies>{''.join(deps)}</dependencies></project>\n")  # fmt: skip


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sluice-bench"


@dataclass(frozen=True)
class Peer:
    """A peer's venv (``requirements`` pip installs into it) and jars (``pom``'s dependencies)."""

    name: str
    requirements: tuple[str, ...]
    pom: str | None = None

    @property
    def venv(self) -> Path:
        return cache_root() / f"venv-{self.name}"

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def ensure_venv(self) -> str:
        """Create the venv and install the requirements unless done before with the same ones; its python."""
        marker, want = self.venv / ".installed", "\n".join(self.requirements)
        if marker.is_file() and marker.read_text() == want:
            return self.python
        shutil.rmtree(self.venv, ignore_errors=True)
        print(f"  installing {', '.join(self.requirements)} into {self.venv} (once)", flush=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(self.venv)], check=True)
        r = subprocess.run([self.python, "-m", "pip", "install", "-q", *self.requirements],
                           capture_output=True, text=True)  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"pip install {' '.join(self.requirements)} failed:\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
        marker.write_text(want)
        return self.python

    def jars(self) -> list[str]:
        """The peer's jars (resolved by Maven once, then from the cache)."""
        if self.pom is None:
            return []
        what = f"the {self.name} peer"
        jars = maven_classpath(what, self.pom, cache_root() / f"jars-{self.name}", how_to_get="apt-get install maven")
        jars_list = jars.split(os.pathsep)
        if self.name == "spark":  # pyspark ships Spark and its dependencies: add only what it lacks
            shipped = Path(self.venv / "lib").glob("python3*/site-packages/pyspark/jars/*.jar")
            have = {_artifact(p.name) for p in shipped}
            jars_list = [j for j in jars_list if _artifact(Path(j).name) not in have]
        return jars_list


def _artifact(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``."""
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar)


FLINK = Peer(
    "flink",
    (f"apache-flink=={FLINK_VERSION}",),
    _pom("flink-peer", [
        _dep("org.apache.flink", "flink-sql-connector-kafka", FLINK_KAFKA_CONNECTOR, transitive=False),
        _dep("org.apache.flink", "flink-sql-parquet", FLINK_VERSION, transitive=False),
        _dep("org.apache.hadoop", "hadoop-client-api", HADOOP_VERSION, transitive=False),
        _dep("org.apache.hadoop", "hadoop-client-runtime", HADOOP_VERSION, transitive=False),
    ]),
)  # fmt: skip
SPARK = Peer(
    "spark", (f"pyspark=={SPARK_VERSION}",), _pom("spark-peer", [_dep("org.apache.spark", "spark-sql-kafka-0-10_2.13", SPARK_VERSION)])
)
QUIX = Peer("quix", (f"quixstreams=={QUIX_VERSION}", "pyarrow==26.0.1"))  # pyarrow: its Parquet sink


def install(peers: tuple[Peer, ...] = (FLINK, SPARK, QUIX)) -> dict[str, tuple[str, list[str]]]:
    """Every peer's venv and jars: ``{name: (python, jars)}``."""
    return {p.name: (p.ensure_venv(), p.jars()) for p in peers}
