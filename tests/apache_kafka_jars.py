"""Apache Kafka's jars for the tests' broker (tests/apache_kafka.py), resolved by Maven once per machine.

The generated pom names ``org.apache.kafka:kafka_2.13`` and log4j's binding for Kafka's slf4j; Maven resolves
them into its local repository and ``dependency:build-classpath`` writes the classpath to
``~/.cache/sluice-tests/apache-kafka-<version>/classpath.txt``. While every jar on it exists, no Maven runs.
``python3 -m tests.apache_kafka_jars --resolve`` (stdlib only, so ``.ci/run`` runs it before any venv
exists; ``python -m tests.apache_kafka --resolve`` is the same) fills the cache.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

__all__ = ["KAFKA_VERSION", "ApacheKafkaUnavailableError", "cache_dir", "class_archive", "find_java", "kafka_classpath"]

KAFKA_VERSION = "4.3.1"
#: the log4j2 that kafka_2.13 KAFKA_VERSION depends on; log4j-slf4j-impl routes Kafka's slf4j 1.7 logging to it
_LOG4J_VERSION = "2.25.4"
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_POM = f"""\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>sluice.tests</groupId><artifactId>apache-kafka-broker</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{_LOG4J_VERSION}</version></dependency>
  </dependencies>
</project>
"""
_HOW_TO_GET = "run .ci/run, or: apt-get install openjdk-17-jre-headless maven && python -m tests.apache_kafka --resolve"


class ApacheKafkaUnavailableError(RuntimeError):
    """Java or Apache Kafka's jars cannot be had; the message says how to get them."""


def cache_dir() -> Path:
    """Where the resolved classpath of :data:`KAFKA_VERSION` is cached."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "sluice-tests" / f"apache-kafka-{KAFKA_VERSION}"


def find_java() -> str:
    """The ``java`` to run: ``$JAVA_HOME/bin/java``, else the one on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        raise ApacheKafkaUnavailableError(f"Apache Kafka's broker needs Java 17+, none found: {_HOW_TO_GET}")
    return java


def _cached_classpath(cache: Path) -> str | None:
    try:
        classpath = (cache / "classpath.txt").read_text().strip()
    except OSError:
        return None
    jars = classpath.split(os.pathsep)
    return classpath if jars and all(Path(j).is_file() for j in jars) else None


def kafka_classpath(resolve: bool = True, cache: Path | None = None, repo_local: Path | None = None) -> str:
    """The broker's classpath, from the cache when every jar on it exists, else resolved by Maven.

    Args:
        resolve: run Maven when the cache is incomplete (else raise).
        cache: the folder of the generated pom and the classpath file (default :func:`cache_dir`).
        repo_local: Maven's local repository (default: Maven's own, ``~/.m2/repository``).

    Raises:
        ApacheKafkaUnavailableError: the jars are not cached and cannot be resolved.
    """
    cache = cache or cache_dir()
    if (classpath := _cached_classpath(cache)) is not None:
        return classpath
    if not resolve:
        raise ApacheKafkaUnavailableError(f"Apache Kafka {KAFKA_VERSION}'s jars are not in {cache}: {_HOW_TO_GET}")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ApacheKafkaUnavailableError(
            f"Apache Kafka {KAFKA_VERSION}'s jars are not in {cache} and Maven (mvn) is not installed: {_HOW_TO_GET}"
        )
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:  # pytest-xdist workers resolve once, one at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (classpath := _cached_classpath(cache)) is not None:
            return classpath
        (cache / "pom.xml").write_text(_POM)
        cmd = [mvn, "-q", "-B", "-f", str(cache / "pom.xml"), f"{_DEPENDENCY_PLUGIN}:build-classpath",
               f"-Dmdep.outputFile={cache / 'classpath.tmp'}"]  # fmt: skip
        if repo_local is not None:
            cmd.append(f"-Dmaven.repo.local={repo_local}")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            tail = "\n".join((r.stdout + r.stderr).splitlines()[-30:])
            raise ApacheKafkaUnavailableError(f"Maven could not resolve Apache Kafka {KAFKA_VERSION}'s jars:\n{tail}")
        os.replace(cache / "classpath.tmp", cache / "classpath.txt")
    if (classpath := _cached_classpath(cache)) is None:
        raise ApacheKafkaUnavailableError(f"Maven wrote an incomplete classpath to {cache / 'classpath.txt'}")
    return classpath


def class_archive(java: str, classpath: str) -> Path:
    """Where the broker's class-data-sharing archive for this Java and classpath lives (a dynamic AppCDS
    archive, written at the first clean exit of a broker: later JVMs start about twice as fast)."""
    real = Path(java).resolve()
    key = f"{real}:{real.stat().st_mtime_ns}:{classpath}".encode()
    return cache_dir() / f"broker-{hashlib.sha256(key).hexdigest()[:16]}.jsa"


def main() -> None:
    """``python -m tests.apache_kafka --resolve``: resolve the jars into the cache (.ci/run does it)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--resolve", action="store_true", help="resolve the jars if the cache is incomplete")
    parser.add_argument("--repo-local", type=Path, help="Maven local repository (default: Maven's own)")
    parser.add_argument("--cache", type=Path, help=f"classpath cache folder (default: {cache_dir()})")
    args = parser.parse_args()
    t0 = time.monotonic()
    classpath = kafka_classpath(resolve=args.resolve, cache=args.cache, repo_local=args.repo_local)
    print(f"Apache Kafka {KAFKA_VERSION}: {len(classpath.split(os.pathsep))} jars ({time.monotonic() - t0:.1f}s)")


if __name__ == "__main__":
    main()
