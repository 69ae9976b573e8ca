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

__all__ = [
    "KAFKA_VERSION",
    "ApacheKafkaUnavailableError",
    "JarsUnavailableError",
    "cache_dir",
    "class_archive",
    "find_java",
    "kafka_classpath",
    "maven_classpath",
]

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


class JarsUnavailableError(RuntimeError):
    """Jars Maven was to resolve cannot be had; the message says how to get them."""


class ApacheKafkaUnavailableError(JarsUnavailableError):
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


def _cached_classpath(cache: Path, pom: str) -> str | None:
    """The cached classpath if it was resolved from ``pom`` and every jar on it exists."""
    try:
        if (cache / "pom.xml").read_text() != pom:
            return None
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
    try:
        return maven_classpath(f"Apache Kafka {KAFKA_VERSION}", _POM, cache or cache_dir(), resolve, repo_local, _HOW_TO_GET)
    except JarsUnavailableError as exc:
        raise ApacheKafkaUnavailableError(str(exc)) from None


def maven_classpath(
    what: str,
    pom: str,
    cache: Path,
    resolve: bool = True,
    repo_local: Path | None = None,
    how_to_get: str = "apt-get install maven",
) -> str:
    """The classpath of the dependencies ``pom`` names, from ``cache`` when every jar on it exists, else
    resolved by Maven (``dependency:build-classpath``) into Maven's local repository and cached.

    Args:
        what: what the jars are, for the messages (``"Apache Kafka 4.3.1"``).
        pom: a pom whose dependencies are the jars wanted (packaging ``pom``).
        cache: the folder of the generated pom and the classpath file; a changed pom resolves anew.
        resolve: run Maven when the cache is incomplete (else raise).
        repo_local: Maven's local repository (default: Maven's own, ``~/.m2/repository``).
        how_to_get: the end of the message when the jars cannot be had.

    Raises:
        JarsUnavailableError: the jars are not cached and cannot be resolved.
    """
    if (classpath := _cached_classpath(cache, pom)) is not None:
        return classpath
    if not resolve:
        raise JarsUnavailableError(f"{what}'s jars are not in {cache}: {how_to_get}")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsUnavailableError(f"{what}'s jars are not in {cache} and Maven (mvn) is not installed: {how_to_get}")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:  # pytest-xdist workers resolve once, one at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (classpath := _cached_classpath(cache, pom)) is not None:
            return classpath
        (cache / "pom.xml").write_text(pom)
        cmd = [mvn, "-q", "-B", "-f", str(cache / "pom.xml"), f"{_DEPENDENCY_PLUGIN}:build-classpath",
               f"-Dmdep.outputFile={cache / 'classpath.tmp'}"]  # fmt: skip
        if repo_local is not None:
            cmd.append(f"-Dmaven.repo.local={repo_local}")
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            tail = "\n".join((r.stdout + r.stderr).splitlines()[-30:])
            raise JarsUnavailableError(f"Maven could not resolve {what}'s jars:\n{tail}")
        os.replace(cache / "classpath.tmp", cache / "classpath.txt")
    if (classpath := _cached_classpath(cache, pom)) is None:
        raise JarsUnavailableError(f"Maven wrote an incomplete classpath to {cache / 'classpath.txt'}")
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
