"""After a claim: fence the transactional sink, then take the later of its position and the
checkpoint's (the step that makes a crash between the two commits lose and repeat nothing)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from azure_functions_db.core.checkpoint import Checkpoint, PollerKey
from azure_functions_db.core.claim import Claim
from azure_functions_db.core.ports import SinkMark, TransactionalSink
from azure_functions_db.core.position import Position
from azure_functions_db.core.retry import Retrying

Advance = Callable[[Position, int, Position | None], Checkpoint]


def catch_up_with_sink(
    sink: TransactionalSink,
    claim: Claim,
    key: PollerKey,
    *,
    retrying: Retrying,
    advanced: Advance,
    log: Callable[..., Any],
) -> None:
    """Claim ``sink`` under ``claim``'s fence and move the checkpoint to a batch it holds.

    A mark exactly one batch ahead of the checkpoint (its sequence is the next one, and its
    batch was read after the checkpoint's position) is a batch whose sink commit landed and
    whose checkpoint commit did not: the checkpoint moves to its end (``advanced(position, rows,
    read_after)`` applies the only-forward and fence rules), so the batch is neither lost nor
    written again. Position equality here compares two copies of one position the database
    returned, never an order.
    """
    cp = claim.checkpoint
    mark: SinkMark | None = retrying(sink.claim, key, claim.fence)
    if mark is None or mark.sequence <= cp.stats.batches:
        return
    if (
        mark.after is not None
        and mark.sequence == cp.stats.batches + 1
        and mark.before == cp.position
    ):
        claim.write(advanced(mark.after, mark.rows, mark.before))
        log(
            logging.WARNING,
            "checkpoint_caught_up_with_sink",
            fence=claim.fence,
            rows=mark.rows,
            sequence=mark.sequence,
            position=mark.after,
            note="the sink had committed this batch; the checkpoint commit had not landed",
        )
        return
    # The sink is further ahead than one batch, or its batch started elsewhere (the checkpoint
    # was reset, moved by `afdb seek`, or belongs to another state store), or the sink no longer
    # knows where its last batch ended (a Delta log cleaned up past it).
    log(
        logging.WARNING,
        "sink_ahead_of_checkpoint",
        fence=claim.fence,
        sink_sequence=mark.sequence,
        checkpoint_sequence=cp.stats.batches,
        sink_position=mark.after,
        position=cp.position,
        note="batches after the checkpoint are written to the sink again",
    )
