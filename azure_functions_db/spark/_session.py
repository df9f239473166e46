"""The Spark session a backfill runs on: the caller's, the active one, or a local one it starts
with quick settings (its JVM only schedules the chunk tasks; rows never pass through it)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from azure_functions_db.errors import ConfigurationError


def session_for(spark: Any, master: str) -> tuple[Any, bool]:
    """The session to use, and whether this call created it (and must stop it)."""
    if spark is not None:
        return spark, False
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ConfigurationError(
            "The backfill runs on Spark, which needs the `spark` extra: "
            "`pip install 'afdb[spark]'` (and Java 17)."
        ) from exc
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    # Under spark-submit (which starts this Python with a gateway to its JVM) its --master wins.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if master.startswith("local") and not submitted:
        # Executors are local Python workers: the same interpreter (with this package) and the
        # loopback address (machines whose host name does not resolve).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName("afdb-backfill").config(
        "spark.ui.showConsoleProgress", "false"
    )
    if not submitted:
        builder = builder.master(master)
        for name, value in local_session_conf(master, os.environ).items():
            builder = builder.config(name, value)
    session = builder.getOrCreate()
    return session, True


#: JVM options of a local session the backfill starts: its JVM only schedules the chunk tasks
#: (rows never pass through it), and Spark's start, first job and stop took about 5 s instead
#: of 8 with them (`afdb backfill` of 1M rows on 2 loaded cores).
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: The Spark settings of a local session the backfill starts, unless the user set them: the
#: quick JVM above, and no web UI (its server took 0.5-1.2 s of the session's start here; the
#: command shows its own progress).
LOCAL_SESSION_CONF = {
    "spark.driver.extraJavaOptions": LOCAL_JAVA_OPTIONS,
    "spark.ui.enabled": "false",
}


def local_session_conf(master: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The settings of :data:`LOCAL_SESSION_CONF` for a local session this process starts that
    the user does not set (in ``spark-defaults.conf``); none when the user sets Spark's
    arguments (``PYSPARK_SUBMIT_ARGS``) or the master is not local (a cluster's driver JVM
    does more than schedule, and its UI is how the cluster is watched)."""
    if not master.startswith("local") or "PYSPARK_SUBMIT_ARGS" in environ:
        return {}
    conf_dir = environ.get("SPARK_CONF_DIR") or (
        str(Path(environ["SPARK_HOME"]) / "conf") if environ.get("SPARK_HOME") else None
    )
    defaults = ""
    if conf_dir is not None:
        with contextlib.suppress(OSError):  # no such file: nothing configured there
            defaults = (Path(conf_dir) / "spark-defaults.conf").read_text(errors="replace")
    return {name: value for name, value in LOCAL_SESSION_CONF.items() if name not in defaults}
