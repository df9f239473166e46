"""Every public error of azure-functions-db.

Each class docstring says what happened and how to fix it; instances carry the data (poller,
etag, fence, value) as attributes so callers never parse messages. Adapters translate driver and
SDK errors into these at their edge and keep the cause (``raise X from exc``).
"""

from __future__ import annotations


class AfdbError(Exception):
    """Base class of every error raised by azure-functions-db.

    ``poller`` and ``namespace`` name the poller an error is about, or are ``None`` when it is
    about no single poller (most configuration errors).
    """

    def __init__(
        self, message: str = "", *, poller: str | None = None, namespace: str | None = None
    ) -> None:
        super().__init__(message)
        self.poller = poller
        self.namespace = namespace


class ConfigurationError(AfdbError, ValueError):
    """A poller, source or store was configured with a value that cannot work.

    The message names the offending value in backticks and says how to fix it.
    """


class SettingNotFoundError(ConfigurationError):
    """A ``%NAME%`` placeholder names an app setting that is not defined.

    Define the setting in ``local.settings.json`` (``Values``), in the app's settings in Azure,
    or in the environment of the local runner.
    """

    def __init__(self, setting: str, where: str, sources: tuple[str, ...] = ()) -> None:
        self.setting = setting
        self.where = where
        self.sources = sources
        read = f" (read: {'; '.join(sources)})" if sources else ""
        super().__init__(
            f"App setting `{setting}` used by {where} is not defined{read}. Define it in "
            "local.settings.json under `Values`, in the Function App's settings, or as an "
            "environment variable for `afdb run`."
        )


class UnresolvedSettingError(ConfigurationError):
    """An app setting still holds a Key Vault reference (``@Microsoft.KeyVault(...)``).

    The Functions platform replaces a reference with the secret's value only when it can read
    it; otherwise the app sees the reference text. Give the app's identity the ``Key Vault
    Secrets User`` role on the vault, check the vault and secret names (the portal shows each
    reference's status under the app's environment variables), or, outside Azure, put the value
    itself in ``local.settings.json`` or the environment.
    """

    def __init__(self, setting: str, where: str) -> None:
        self.setting = setting
        self.where = where
        super().__init__(
            f"App setting `{setting}` used by {where} holds an unresolved Key Vault reference "
            "(`@Microsoft.KeyVault(...)`), not a value. In Azure, the platform could not read "
            "the secret: give the app's managed identity the `Key Vault Secrets User` role on "
            "the vault and check the vault and secret names (the portal shows the reference's "
            "status in the app's environment variables). Locally nothing resolves references: "
            "put the value itself in local.settings.json or the environment."
        )


class SourceError(AfdbError):
    """The database source failed: connection, reflection or query.

    Infrastructure failures are retried with backoff inside a run; if this reaches you, the
    retries were exhausted or the error is not transient. The batch was not acknowledged.
    """


class TransientSourceError(SourceError):
    """A database error that may go away on retry (connection reset, timeout, deadlock).

    The engine retries it with backoff and jitter a bounded number of times within the run.
    """


class HorizonUnavailable(SourceError):
    """The commit-safe horizon cannot be computed (missing privilege, standby server, cursor
    type without one). ``reason`` says why and how to fix it; ``fix``, when one statement fixes
    it, is that statement (a ``GRANT``); ``horizon="auto"`` falls back to ``lag`` on it, once and
    loudly."""

    def __init__(self, reason: str, fix: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fix = fix


class SourceDefinitionError(SourceError, ConfigurationError):
    """The table, a column or the source definition does not match the database."""


class NullCursorError(SourceError):
    """Rows with a NULL cursor were found and the source is set to ``on_null_cursor="raise"``.

    Give those rows a cursor value (for example a default of ``CURRENT_TIMESTAMP``), exclude them
    with ``where=``, or choose ``on_null_cursor="skip"`` to count and report them instead.
    """

    def __init__(self, table: str, column: str, count: int) -> None:
        self.table = table
        self.column = column
        self.count = count
        super().__init__(
            f"{count} row(s) of `{table}` have a NULL cursor `{column}` and would never be "
            "delivered. Give them a cursor value, exclude them with `where=`, or set "
            '`on_null_cursor="skip"` to count and report them instead.'
        )


class StateStoreError(AfdbError):
    """The checkpoint or lease store failed (I/O, permissions, service error).

    Transient failures are retried; if this reaches you the run stopped without acknowledging
    its current batch, which will be redelivered.
    """


class TransientStoreError(StateStoreError):
    """A state-store error that may go away on retry (5xx, throttling, lock timeout).

    Whether a write that failed this way landed is unknown: the engine never assumes it did not;
    the next run reloads the state and decides (at worst a duplicate delivery).
    """


class CheckpointConflictError(StateStoreError):
    """A compare-and-set write found a different record than expected.

    Another writer changed the checkpoint since this run read it: usually another instance that
    acquired the lease after this one lost it. This run's batch is not acknowledged and will be
    redelivered by the current owner.
    """

    def __init__(
        self,
        poller: str,
        namespace: str,
        *,
        expected_etag: str | None,
        found_etag: str | None,
        fence: int | None = None,
        found_fence: int | None = None,
        reason: str | None = None,
    ) -> None:
        self.expected_etag = expected_etag
        self.found_etag = found_etag
        self.fence = fence
        self.found_fence = found_fence
        if reason is None:
            if found_fence is not None and fence is not None and found_fence > fence:
                reason = (
                    f"another instance holds the lease (fence {found_fence} > {fence}); "
                    "this run's batch will be redelivered"
                )
            elif found_etag is None:
                reason = "the record does not exist (was it deleted by an operator?)"
            else:
                reason = "another writer changed it; this run's batch will be redelivered"
        self.reason = reason
        super().__init__(
            f"Checkpoint for poller `{poller}` (namespace `{namespace}`) was changed by another "
            f"writer (expected etag `{expected_etag}`, found `{found_etag}`): {reason}.",
            poller=poller,
            namespace=namespace,
        )


class RecordExistsError(StateStoreError):
    """A create-only write found a record already in place."""

    def __init__(self, poller: str, namespace: str) -> None:
        super().__init__(
            f"Checkpoint for poller `{poller}` (namespace `{namespace}`) already exists; "
            "create-only writes never overwrite. Read it and write by etag instead.",
            poller=poller,
            namespace=namespace,
        )


class CheckpointCorruptError(StateStoreError):
    """A stored checkpoint cannot be decoded or has an unknown schema. It is never overwritten.

    Inspect it (``afdb status``), then restore it from a backup, or move the record aside and
    set the position with ``afdb seek`` (which writes a new record); the poller stays stopped
    until an operator decides.
    """

    def __init__(self, poller: str, namespace: str, detail: str) -> None:
        self.detail = detail
        super().__init__(
            f"Checkpoint for poller `{poller}` (namespace `{namespace}`) cannot be read: "
            f"{detail}. It was left untouched. Inspect it with `afdb status`, then restore it "
            "from a backup, or move the record aside and set the position with `afdb seek` "
            "(`--beginning`, `--now` or `--cursor`), which writes a new record.",
            poller=poller,
            namespace=namespace,
        )


class QuarantineExistsError(RecordExistsError):
    """A create-only write of a quarantine record found one with its id (read, write by etag)."""

    def __init__(self, poller: str, namespace: str, record_id: str) -> None:
        self.record_id = record_id
        StateStoreError.__init__(
            self,
            f"Quarantine record `{record_id}` of poller `{poller}` (namespace `{namespace}`) "
            "already exists; create-only writes never overwrite.",
            poller=poller,
            namespace=namespace,
        )


class QuarantineConflictError(CheckpointConflictError):
    """A compare-and-set write of a quarantine record found another version, or none: another
    run or operator command changed it since it was read. Read it again and decide again."""

    def __init__(
        self, poller: str, namespace: str, record_id: str, *, expected_etag: str, found: str | None
    ) -> None:
        self.record_id = record_id
        self.expected_etag, self.found_etag = expected_etag, found
        self.fence = self.found_fence = None
        self.reason = "the record is gone" if found is None else "another writer changed it"
        StateStoreError.__init__(
            self,
            f"Quarantine record `{record_id}` of poller `{poller}` (namespace `{namespace}`) "
            f"was changed by another writer (expected etag `{expected_etag}`, found "
            f"`{found}`): {self.reason}. Read it again (`afdb quarantine show`) and retry.",
            poller=poller,
            namespace=namespace,
        )


class QuarantineCorruptError(CheckpointCorruptError):
    """A stored quarantine record cannot be decoded; it is never overwritten. ``afdb quarantine
    list`` shows it as unreadable: restore it from a backup or move it aside."""

    def __init__(self, poller: str, namespace: str, record_id: str, detail: str) -> None:
        self.detail = detail
        self.record_id = record_id
        StateStoreError.__init__(
            self,
            f"Quarantine record `{record_id}` of poller `{poller}` (namespace `{namespace}`) "
            f"cannot be read: {detail}. It was left untouched; restore it from a backup or move "
            "it aside.",
            poller=poller,
            namespace=namespace,
        )


class QuarantineStateError(AfdbError):
    """A quarantine command cannot apply to the record as it is (missing, replayed or dropped
    already, or holding values kept only as text); the message says which and what to do."""

    def __init__(self, poller: str, namespace: str, record_id: str, detail: str) -> None:
        self.record_id = record_id
        self.detail = detail
        super().__init__(
            f"Quarantine record `{record_id}` of poller `{poller}` (namespace `{namespace}`): "
            f"{detail}",
            poller=poller,
            namespace=namespace,
        )


class CodecError(AfdbError, ValueError):
    """A value cannot be encoded into, or decoded from, a checkpoint (an unsupported type, or a
    stored value whose tag is unknown). Sources refuse such a column when they open; a stored
    one makes the checkpoint unreadable (:class:`CheckpointCorruptError`)."""


class StaleFenceError(AfdbError):
    """The stored checkpoint was written under a newer fence than the caller's: another owner
    took the poller over. Raised by the checkpoint's rules; the engine turns it into a lost
    lease, the operator commands into a refusal."""

    def __init__(self, poller: str, namespace: str, *, stored: int, mine: int) -> None:
        self.stored = stored
        self.mine = mine
        super().__init__(
            f"checkpoint {namespace}/{poller} has fence {stored} > {mine}",
            poller=poller,
            namespace=namespace,
        )


class PositionNotForwardError(AfdbError):
    """A commit of a batch that was not read after the stored position, or that ends on it.
    Raised by the checkpoint's rules; the engine reports it as :class:`PositionRegressionError`.
    """

    def __init__(
        self,
        poller: str,
        namespace: str,
        *,
        stored: object,
        proposed: object,
        read_after: object,
    ) -> None:
        self.stored = stored
        self.proposed = proposed
        self.read_after = read_after
        super().__init__(
            f"checkpoint {namespace}/{poller}: a batch read after {read_after} cannot move the "
            f"stored position {stored} to {proposed}",
            poller=poller,
            namespace=namespace,
        )


class PositionRegressionError(AfdbError):
    """A commit of a batch that was not read after the stored position (or ends on it).

    Positions only move forward, in the database's order: a batch may only be committed over
    the position it was read after. The only way back is an audited ``afdb seek``.
    """

    def __init__(
        self, poller: str, stored: str, proposed: str, namespace: str | None = None
    ) -> None:
        self.stored = stored
        self.proposed = proposed
        super().__init__(
            f"Refusing to move the checkpoint of poller `{poller}` from {stored} to {proposed}: "
            "positions only move forward. Use `afdb seek` to rewind on purpose.",
            poller=poller,
            namespace=namespace,
        )


class LeaseLostError(AfdbError):
    """This run no longer holds the poller's lease (renewal failed, or it expired).

    The run stops without calling the handler again or committing; the new owner redelivers the
    unacknowledged batch.
    """

    def __init__(self, poller: str, namespace: str, fence: int, detail: str = "") -> None:
        self.fence = fence
        self.detail = detail
        suffix = f": {detail}" if detail else ""
        super().__init__(
            f"Lease for poller `{poller}` (namespace `{namespace}`, fence {fence}) was lost"
            f"{suffix}. The current batch was not acknowledged and will be redelivered.",
            poller=poller,
            namespace=namespace,
        )


class FenceBehindCheckpointError(LeaseLostError):
    """The lease granted a fence lower than the one already stored in the checkpoint.

    Either a newer owner fenced the checkpoint after this lease was taken, or the lease record
    lost its counter (a deleted lease blob or file restarts it at 1). In the second case the
    poller cannot proceed until the lease's fence is raised: stop every instance, then set the
    lease's ``fence`` (blob metadata ``fence``, or ``fence`` in the local ``.lease`` file) to at
    least the checkpoint's fence shown by ``afdb status``.
    """

    def __init__(self, poller: str, namespace: str, fence: int, stored: int) -> None:
        self.stored = stored
        super().__init__(
            poller,
            namespace,
            fence,
            f"the checkpoint already carries fence {stored}. If no other instance is running, "
            f"the lease record lost its counter: stop every instance and set the lease's `fence` "
            f"to {stored} or more (see docs/state.md, 'Repair')",
        )


class SinkFencedError(LeaseLostError):
    """A transactional sink refused this owner's write: its position record holds a newer
    fence. Another owner claimed the poller; nothing of the batch was committed to the sink."""

    def __init__(self, poller: str, namespace: str, fence: int, stored: int) -> None:
        self.stored = stored
        super().__init__(
            poller,
            namespace,
            fence,
            f"the sink's position record holds fence {stored}, a newer owner's; the sink "
            "transaction was rolled back",
        )


class SinkError(AfdbError):
    """Writing to a sink, or reading its position record, failed (connection, permission,
    constraint). The batch's sink transaction was rolled back and the batch is not
    acknowledged; the message names the sink and the cause."""


class TransientSinkError(SinkError):
    """A sink failure a retry may fix (a dropped connection, a timeout, a lock wait)."""


class LeaseHeldError(AfdbError):
    """Another owner holds the poller's lease, which an operator command (seek) needs: wait for
    its run to end (or the lease to expire after its duration) and retry."""

    def __init__(self, poller: str, namespace: str, holder: str | None) -> None:
        self.holder = holder
        super().__init__(
            f"Lease for poller `{poller}` (namespace `{namespace}`) is held by "
            f"`{holder or 'another owner'}`. Wait for its run to finish or the lease to "
            "expire, then retry.",
            poller=poller,
            namespace=namespace,
        )


class ReshardError(AfdbError):
    """A run refused (every time, until an operator acts): the poller was retired by ``afdb
    reshard``, or is a new shard waiting for it to be positioned (``docs/scale.md``)."""


class HandlerContractError(AfdbError, TypeError):
    """A handler call returned something other than ``None`` (a generator, a lazy iterator).

    The body of a generator never runs, and the engine cannot tell whether work a returned value
    describes was done, so the call counts as a failed attempt and the batch is not
    acknowledged. Write ``def on_rows(batch): ...`` (or ``async def``) that returns ``None``.
    """


class HandlerError(AfdbError):
    """The user's handler raised; the batch was not acknowledged and will be redelivered.

    ``attempts`` counts consecutive failures at this position. Fix the handler or the data; if
    the batch can never succeed, choose a poison policy or move past it with ``afdb seek``.
    """

    def __init__(self, poller: str, namespace: str, attempts: int, rows: int) -> None:
        self.attempts = attempts
        self.rows = rows
        super().__init__(
            f"Handler of poller `{poller}` (namespace `{namespace}`) failed on a batch of "
            f"{rows} row(s) (attempt {attempts}); the checkpoint was not moved and the batch "
            "will be redelivered.",
            poller=poller,
            namespace=namespace,
        )


class PoisonBatchError(HandlerError):
    """A batch failed ``max_attempts`` times and the poison policy is ``halt``.

    The poller keeps retrying the same batch on every run and reports this error so alerts fire.
    Fix the handler or the data, or move past the batch deliberately with ``afdb seek``.
    """

    def __init__(self, poller: str, namespace: str, attempts: int, rows: int) -> None:
        super().__init__(poller, namespace, attempts, rows)
        self.args = (
            f"Poison batch: poller `{poller}` (namespace `{namespace}`) failed {attempts} times "
            f"on the same batch of {rows} row(s). Nothing was skipped; the poller retries it on "
            "every run. Fix the handler or data, or move past it with "
            f"`afdb seek APP --poller {poller} --cursor ...`.",
        )


class BackfillError(AfdbError):
    """A backfill's Spark job failed; finished chunks keep their checkpoints.

    Fix the cause (the message names the first error a task raised) and rerun with the same
    ``--run-id``: finished chunks are skipped, the others resume from their checkpoints.
    """


class UnexpectedRunError(AfdbError):
    """A poller's run ended with an error that is not one of the library's own.

    A driver's or SDK's error that was not translated, or a bug: the batch was not acknowledged.
    The cause (``__cause__``) and its traceback are logged; please report it.
    """

    def __init__(self, poller: str, cause: BaseException, namespace: str | None = None) -> None:
        super().__init__(
            f"Poller `{poller}` stopped on an unexpected {type(cause).__name__}: {cause}. The "
            "current batch was not acknowledged; the other pollers keep running.",
            poller=poller,
            namespace=namespace,
        )
