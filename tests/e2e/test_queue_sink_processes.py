"""QueueSink with real processes on Azurite: at-least-once through kill -9.

A poller process sends each batch to a queue and is SIGKILLed right after sending, before its
checkpoint commit, five times in a row: every batch it sent is sent again by the next run. The
queue then holds duplicates, each with the same ``event_id`` as its first copy, and a consumer
that deduplicates on ``event_id`` sees every row version exactly once.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from pathlib import Path

import pytest
from azure.storage.queue import QueueClient

from devkit.azurite import Azurite
from tests.support.sqlite_orders import Orders

pytestmark = pytest.mark.slow

APP = textwrap.dedent(
    """
    import os
    import azure_functions_db as afdb
    from azure_functions_db.sinks.queue import QueueSink
    from tests.support.dying_store import DiesAfterTheSinkCommit, handled

    out = QueueSink(os.environ["Q_NAME"])
    db = afdb.PollerBlueprint()

    @db.poller(
        name="orders",
        schedule="0 0 * * * *",
        source=afdb.SqlSource(url="%Q_DB%", table="orders", cursor="updated_at", pk="id"),
        state=DiesAfterTheSinkCommit(os.environ["Q_STATE"]),
        batch_size=4,
    )
    def forward(batch):
        handled(out.send(batch))
    """
)


def test_kill_9_after_sending_redelivers_with_the_same_event_ids(
    tmp_path: Path, azurite: Azurite
) -> None:
    orders = Orders(tmp_path / "orders.db")
    orders.insert(range(1, 25))
    orders.close()
    (tmp_path / "function_app.py").write_text(APP)
    name = f"q-{uuid.uuid4().hex[:12]}"
    env = {
        **os.environ,
        "AzureWebJobsStorage": azurite.connection_string,
        "Q_NAME": name,
        "Q_DB": orders.url,
        "Q_STATE": str(tmp_path / "state"),
    }
    command = [
        sys.executable,
        "-m",
        "azure_functions_db",
        "run",
        str(tmp_path / "function_app.py"),
        "--once",
    ]
    for kill in range(5):
        done = subprocess.run(
            command, check=False, env={**env, "SINK_KILL": "1"}, capture_output=True, timeout=120
        )
        assert done.returncode == -signal.SIGKILL, (kill, done.stdout, done.stderr)
    done = subprocess.run(command, check=False, env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    bodies = []
    with QueueClient.from_connection_string(azurite.connection_string, name) as client:
        while page := list(client.receive_messages(messages_per_page=32, max_messages=32)):
            for message in page:
                bodies.append(json.loads(base64.b64decode(message.content)))
                client.delete_message(message)
    ids = Counter(b["data"]["id"] for b in bodies)
    # The first batch (ids 1-4) was sent by all five killed runs and the last one: 6 copies.
    assert ids == Counter({**{i: 6 for i in range(1, 5)}, **{i: 1 for i in range(5, 25)}})
    events = {b["data"]["id"]: set() for b in bodies}
    for body in bodies:
        events[body["data"]["id"]].add(body["event_id"])
    assert all(len(e) == 1 for e in events.values())  # the dedup key never changes
    assert len({e for es in events.values() for e in es}) == 24
