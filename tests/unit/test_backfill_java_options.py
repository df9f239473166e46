"""The JVM options of a local Spark session the backfill starts itself: the quick compiler and
the serial collector (its JVM only schedules the chunk tasks), never over the user's own."""

from __future__ import annotations

from pathlib import Path

from azure_functions_db.spark.job import LOCAL_JAVA_OPTIONS, local_java_options


def test_a_local_session_gets_the_quick_jvm_options():
    assert local_java_options("local[2]", {}) == LOCAL_JAVA_OPTIONS
    assert local_java_options("local[*]", {"SPARK_HOME": "/nowhere"}) == LOCAL_JAVA_OPTIONS


def test_a_cluster_master_keeps_the_jvm_defaults():
    assert local_java_options("spark://head:7077", {}) is None
    assert local_java_options("yarn", {}) is None


def test_the_users_own_jvm_options_win(tmp_path: Path):
    assert local_java_options("local[2]", {"PYSPARK_SUBMIT_ARGS": "pyspark-shell"}) is None
    defaults = tmp_path / "spark-defaults.conf"
    defaults.write_text("spark.driver.memory 2g\n")
    assert local_java_options("local[2]", {"SPARK_CONF_DIR": str(tmp_path)}) == LOCAL_JAVA_OPTIONS
    defaults.write_text("spark.driver.extraJavaOptions -Dhttps.proxyHost=proxy\n")
    assert local_java_options("local[2]", {"SPARK_CONF_DIR": str(tmp_path)}) is None
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text(defaults.read_text())
    assert local_java_options("local[2]", {"SPARK_HOME": str(tmp_path)}) is None
