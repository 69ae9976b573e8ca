"""Spark with the Iceberg runtime from Maven, as a reader of Iceberg tables apart from pyiceberg.

The Iceberg runtime is built per Spark minor version, and none exists yet for the Spark the project runs on
(pyspark 4.3): the reader runs Spark ``SPARK`` (pyspark from PyPI, in a virtual environment of its own, made
once under ``~/.cache/sluice``) with ``org.apache.iceberg:iceberg-spark-runtime-<SPARK>_2.13:<ICEBERG>``
resolved by Maven into its local repository. Both are fetched once and kept; a machine without them and
without network fails with a line saying what to fetch, never skips.

:func:`spark_snapshots` reads every snapshot of a table (by its metadata file and snapshot id, no catalog)
in one Spark application and returns the rows of each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["ICEBERG", "SPARK", "runtime_jar", "spark_python", "spark_snapshots"]

SPARK = "4.1"
ICEBERG = "1.12.0"
ARTIFACT = f"org.apache.iceberg:iceberg-spark-runtime-{SPARK}_2.13:{ICEBERG}"
_CACHE = Path(os.environ.get("SLUICE_TEST_CACHE", Path.home() / ".cache" / "sluice"))

_READER = r"""
import json, sys
from pyspark.sql import SparkSession
jar, metadata, out = sys.argv[1], sys.argv[2], sys.argv[3]
snapshots = json.loads(sys.argv[4])
columns = json.loads(sys.argv[5])
spark = (SparkSession.builder.master("local[1]").appName("iceberg-reader").config("spark.jars", jar)
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
         .config("spark.driver.memory", "512m").getOrCreate())
with open(out, "w") as f:
    for sid in snapshots:
        rows = spark.read.format("iceberg").option("versionAsOf", str(sid)).load(metadata).select(*columns).collect()
        f.write(json.dumps({"snapshot": sid, "rows": [list(r) for r in rows]}) + "\n")
spark.stop()
"""


def runtime_jar() -> Path:
    """The Iceberg Spark runtime jar in Maven's local repository, resolved by Maven if it is not there."""
    group, artifact, version = ARTIFACT.split(":")
    jar = Path.home() / ".m2" / "repository" / group.replace(".", "/") / artifact / version / f"{artifact}-{version}.jar"
    if jar.exists():
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(f"{jar} is missing and Maven (mvn) is not installed: apt-get install maven")
    done = subprocess.run([mvn, "-q", "-B", "dependency:get", f"-Dartifact={ARTIFACT}", "-Dtransitive=false"],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    if done.returncode != 0 or not jar.exists():
        raise RuntimeError(f"Maven could not resolve {ARTIFACT}: {done.stdout[-500:]} {done.stderr[-500:]}")
    return jar


def spark_python() -> Path:
    """The interpreter of a virtual environment holding pyspark ``SPARK`` (made once, then reused)."""
    env = _CACHE / f"pyspark-{SPARK}"
    python = env / "bin" / "python"
    probe = [str(python), "-c", "import pyspark; print(pyspark.__version__)"]
    if python.exists() and subprocess.run(probe, capture_output=True, text=True).stdout.startswith(SPARK):
        return python
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", f"pyspark=={SPARK}.*"],
                          capture_output=True, text=True, timeout=1200)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"pip could not install pyspark=={SPARK}.* into {env}: {done.stderr[-500:]}")
    return python


def spark_snapshots(metadata: str, snapshots: list[int], columns: list[str]) -> dict[int, list[list[Any]]]:
    """``{snapshot id: rows}`` of the table whose current metadata file is ``metadata``, read by Spark."""
    python, jar = spark_python(), runtime_jar()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.jsonl"
        done = subprocess.run(
            [str(python), "-c", _READER, str(jar), metadata, str(out), json.dumps(snapshots), json.dumps(columns)],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the Spark reader failed: {done.stderr[-3000:]}")
        return {int(r["snapshot"]): r["rows"] for r in map(json.loads, out.read_text().splitlines())}
