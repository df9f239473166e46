"""Case L: how the current source definition differs from the one a checkpoint was written for.

A stored position is a ``(cursor..., pk...)`` value of one table: it means nothing for another
table, cursor or key, so such a change stops the poller until an operator moves the checkpoint.
A changed ``where`` filter or column list keeps the position meaningful: the poller continues.
The engine applies these rules before every run; ``afdb validate`` reports them without running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from azure_functions_db.core.checkpoint import PollerKey, SourceDescription
from azure_functions_db.errors import SourceDefinitionError

#: What continuing after a changed ``where`` means (logged by the engine, shown by validate).
FILTER_CHANGED_NOTE = (
    "continuing from the stored position; rows the old filter excluded below it are not revisited"
)
#: What continuing after a changed column list means.
COLUMNS_CHANGED_NOTE = (
    "continuing from the stored position; rows below it are not re-read with the new columns"
)


@dataclass(frozen=True)
class SourceChange:
    """The differences between the stored (``old``) and current (``new``) source description."""

    old: SourceDescription
    new: SourceDescription

    @property
    def key_changed(self) -> bool:
        """Table, cursor or pk changed: the stored position cannot be used."""
        old, new = self.old, self.new
        return (old.table, old.cursor, old.pk) != (new.table, new.cursor, new.pk)

    @property
    def where_changed(self) -> bool:
        """The fingerprint of the ``where`` filter changed."""
        return self.old.where != self.new.where

    @property
    def columns_added(self) -> tuple[str, ...]:
        """Columns read now but not when the checkpoint was written (empty if not recorded)."""
        old, new = self.old.columns, self.new.columns
        if old is None or new is None:
            return ()
        return tuple(c for c in new if c not in old)

    @property
    def columns_removed(self) -> tuple[str, ...]:
        """Columns no longer read (empty if not recorded)."""
        old, new = self.old.columns, self.new.columns
        if old is None or new is None:
            return ()
        return tuple(c for c in old if c not in new)

    @property
    def columns_changed(self) -> bool:
        """The recorded column lists differ (order included); ``False`` if either is unknown."""
        old, new = self.old.columns, self.new.columns
        return old is not None and new is not None and old != new

    def key_changed_message(self, poller: str, namespace: str, app: str = "APP") -> str:
        """Why the poller cannot continue, and the ways out (for ``SourceDefinitionError``)."""
        old, new = self.old, self.new
        return (
            f"Poller `{poller}` (namespace `{namespace}`) has a checkpoint for table "
            f"`{old.table}` cursor {list(old.cursor)} pk {list(old.pk)}, but is now "
            f"configured with table `{new.table}` cursor {list(new.cursor)} pk "
            f"{list(new.pk)}; the stored position means nothing for the new columns. Either "
            f"restore the old definition, move the checkpoint with `afdb seek {app} --poller "
            f"{poller} --beginning` (or `--now`), or give the poller a new name."
        )


def source_change(old: SourceDescription | None, new: SourceDescription) -> SourceChange | None:
    """The change from ``old`` (stored with the checkpoint, if any) to ``new``; ``None`` if none."""
    if old is None or old == new:
        return None
    return SourceChange(old, new)


def check_source_change(
    old: SourceDescription | None,
    new: SourceDescription,
    key: PollerKey,
    log: Callable[..., None],
) -> None:
    """Case L before a run: a changed cursor, key or table cannot continue
    (:class:`SourceDefinitionError`); a changed filter or column list can, logged as a warning
    (the fencing write then records the new definition)."""
    change = source_change(old, new)
    if change is None:
        return
    if change.key_changed:
        raise SourceDefinitionError(change.key_changed_message(key.poller, key.namespace))
    if change.where_changed:
        log(
            logging.WARNING,
            "source_filter_changed",
            old_where=change.old.where,
            new_where=change.new.where,
            note=FILTER_CHANGED_NOTE,
        )
    if change.columns_changed:
        log(
            logging.WARNING,
            "source_columns_changed",
            added=",".join(change.columns_added) or "-",
            removed=",".join(change.columns_removed) or "-",
            note=COLUMNS_CHANGED_NOTE,
        )
