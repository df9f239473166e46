"""The settings of a local Spark session the backfill starts itself: the quick compiler and the
serial collector (its JVM only schedules the chunk tasks) and no web UI, never over the user's
own."""

from __future__ import annotations

from pathlib import Path

from azure_functions_db.spark._session import LOCAL_JAVA_OPTIONS, local_session_conf

QUICK = {"spark.driver.extraJavaOptions": LOCAL_JAVA_OPTIONS, "spark.ui.enabled": "false"}


def test_a_local_session_gets_the_quick_jvm_and_no_web_ui():
    assert local_session_conf("local[2]", {}) == QUICK
    assert local_session_conf("local[*]", {"SPARK_HOME": "/nowhere"}) == QUICK


def test_a_cluster_master_keeps_the_defaults():
    assert local_session_conf("spark://head:7077", {}) == {}
    assert local_session_conf("yarn", {}) == {}


def test_the_users_own_settings_win(tmp_path: Path):
    assert local_session_conf("local[2]", {"PYSPARK_SUBMIT_ARGS": "pyspark-shell"}) == {}
    defaults = tmp_path / "spark-defaults.conf"
    defaults.write_text("spark.driver.memory 2g\n")
    assert local_session_conf("local[2]", {"SPARK_CONF_DIR": str(tmp_path)}) == QUICK
    defaults.write_text("spark.driver.extraJavaOptions -Dhttps.proxyHost=proxy\n")
    assert local_session_conf("local[2]", {"SPARK_CONF_DIR": str(tmp_path)}) == {
        "spark.ui.enabled": "false"
    }
    defaults.write_text("spark.ui.enabled true\n")
    assert local_session_conf("local[2]", {"SPARK_CONF_DIR": str(tmp_path)}) == {
        "spark.driver.extraJavaOptions": LOCAL_JAVA_OPTIONS
    }
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "spark-defaults.conf").write_text(
        "spark.driver.extraJavaOptions -Xss4m\nspark.ui.enabled true\n"
    )
    assert local_session_conf("local[2]", {"SPARK_HOME": str(tmp_path)}) == {}
