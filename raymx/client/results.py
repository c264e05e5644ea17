"""What the write methods return (as pymongo's results, plus the GTID the
write committed under)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raymx.storage.gtid import GTID


def _gtid(x) -> GTID | None:
    return None if x is None else GTID(*x)


@dataclass
class InsertOneResult:
    inserted_id: Any
    gtid: GTID | None


@dataclass
class InsertManyResult:
    inserted_ids: list
    gtid: GTID | None


@dataclass
class UpdateResult:
    matched_count: int
    modified_count: int
    upserted_id: Any
    gtid: GTID | None


@dataclass
class ReplaceManyResult:
    """``replace_many``: rows that found their document (``matched_count``),
    documents it changed (``modified_count``: a row equal to the stored
    document changes nothing), the ``_id``s of the rows inserted (upsert), and
    the GTID (None when nothing changed)."""
    matched_count: int
    modified_count: int
    upserted_ids: list
    gtid: GTID | None


@dataclass
class DeleteResult:
    deleted_count: int
    gtid: GTID | None


@dataclass
class BulkWriteResult:
    """What ``bulk_write`` did (pymongo's counts), plus ``gtids``: the GTID of
    each statement it ran, in order (consecutive ``InsertOne``s run as one
    statement; inside a transaction none: the commit has the GTID), and
    ``gtid``, the last of them: read after it to see every write of the bulk."""

    inserted_count: int = 0
    matched_count: int = 0
    modified_count: int = 0
    deleted_count: int = 0
    upserted_count: int = 0
    upserted_ids: dict = field(default_factory=dict)  # request index -> _id
    gtids: list = field(default_factory=list)
    acknowledged: bool = True

    @property
    def gtid(self) -> GTID | None:
        return self.gtids[-1] if self.gtids else None

    @property
    def bulk_api_result(self) -> dict:
        """pymongo's raw shape of the same counts."""
        return {"nInserted": self.inserted_count, "nMatched": self.matched_count,
                "nModified": self.modified_count, "nRemoved": self.deleted_count,
                "nUpserted": self.upserted_count,
                "upserted": [{"index": i, "_id": v} for i, v in self.upserted_ids.items()],
                "writeErrors": [], "writeConcernErrors": []}
