"""What the write methods return (as pymongo's results, plus the GTID the
write committed under)."""
from __future__ import annotations

from dataclasses import dataclass
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
class DeleteResult:
    deleted_count: int
    gtid: GTID | None
