"""raymx.storage.errors: every error a user or an operator can see.

The classes live here, at the bottom of the package, because the storage
layer raises most of them (bad documents, filters and names, duplicate keys,
corrupt or trimmed oplog entries) and ``raymx.storage`` imports nothing from
the user-facing ``raymx`` package above it (tests/test_layers.py checks).
``raymx.errors`` re-exports every name in ``__all__``: the same class
objects, so ``except raymx.errors.X`` catches what storage raises, and
either import path may be used.

Errors cross the client port as ``{"err": <class name>, "msg": ..., "info": {...}}``
(``RaymxError.to_wire``) and are rebuilt on the driver as the same class
(``from_wire``), so ``except raymx.errors.X`` works the same in-process and
across the wire. Add new errors here only, and list them in ``__all__`` here
and in raymx/errors.py.
"""
from __future__ import annotations

__all__ = [
    "RaymxError", "InvalidInput", "InvalidDocument", "DocumentTooLarge", "TransactionTooLarge",
    "InvalidName", "InvalidFilter", "InvalidUpdate", "UpdateOverflow", "ImmutableField",
    "ConflictingUpdateOperators", "TypeMismatch", "PathNotViable", "UpdateBadValue",
    "CannotIndexParallelArrays", "InvalidOperation", "IllegalOperation",
    "DuplicateKey",
    "IndexOptionsConflict", "IndexKeySpecsConflict",
    "SchemaMismatch", "CollectionNotFound", "CollectionExists", "IndexNotFound", "ProtocolError",
    "AuthenticationFailed", "CorruptEntry", "CorruptStore", "BatchRefused", "NotPrimary",
    "NotPrimaryOrSecondary", "PrimaryUnavailable", "WriteConcernTimeout",
    "UnsatisfiableWriteConcern", "ReadConcernTimeout",
    "ExecutionTimeout", "Interrupted",
    "StaleRead", "Diverged", "TooStale", "OplogTrimmed", "StaleTerm", "IrreversibleOp",
    "ShutDown", "ConnectionLost", "RequestTimeout", "TransactionAborted", "WriteConflict",
    "RetryRecorded",
    "DiskFailed",
    "DiskFull", "ConfigError", "ArchiveError", "LimitExceeded", "TLSError", "BulkWriteError",
    "OperationFailure", "ConnectionFailure", "AutoReconnect", "ServerSelectionTimeoutError",
    # pymongo's names for the classes above (the same class objects)
    "PyMongoError", "DuplicateKeyError", "NotPrimaryError", "WTimeoutError", "NetworkTimeout",
    "ConfigurationError",
    "from_wire",
]


class RaymxError(Exception):
    """Base class. ``info`` carries structured details (a GTID, a field name)."""

    retryable = False

    def __init__(self, msg: str = "", **info):
        super().__init__(msg)
        self.msg = msg
        self.info = info

    def to_wire(self) -> dict:
        return {"err": type(self).__name__, "msg": self.msg, "info": self.info}


# --- pymongo's base classes -----------------------------------------------
# Code written for pymongo catches these names; here they are bases of the
# raymx classes with that meaning, so ``except OperationFailure`` catches what
# a member refused and ``except AutoReconnect`` what a retry may cure. The
# pymongo names of single classes are aliases at the end of this module.
class OperationFailure(RaymxError):
    """A member refused or failed an operation (pymongo's ``OperationFailure``):
    bad input, a duplicate key, a write concern or read concern timeout, an
    aborted transaction, a full disk, a used-up limit."""


class RetryRecorded(OperationFailure):
    """A retryable write whose session record already holds its txnNumber (or
    a newer one): it is not applied again. The record is checked inside the
    write's own transaction, so a retry that raced its first attempt (the
    first still queued when the driver gave up on it) cannot apply twice; the
    client port answers it from the record (``raymx/wire/sessions.py``)."""


class ConnectionFailure(RaymxError):
    """A member could not be reached or the connection to it failed
    (pymongo's ``ConnectionFailure``)."""


class AutoReconnect(ConnectionFailure):
    """The connection or the member's role changed under the request (lost
    connection, not primary, no primary yet, shutting down, no answer in
    time); the driver retries what is safe to retry, and the caller may retry
    the rest once it knows the outcome (pymongo's ``AutoReconnect``)."""


class ServerSelectionTimeoutError(AutoReconnect):
    """No member fit the request in time: no primary (``PrimaryUnavailable``)
    or none that satisfies the read preference (``StaleRead``); pymongo's
    name for the same failure."""


# --- bad input: the caller can fix these; nothing was written -------------
class InvalidInput(OperationFailure):
    """Base of errors caused by what the caller sent."""


class InvalidDocument(InvalidInput):
    """A document or value msgpack cannot carry, a non-string key, a bad _id."""


class CannotIndexParallelArrays(InvalidDocument):
    """A document holding arrays at two fields of one compound index, neither
    inside the other (MongoDB's CannotIndexParallelArrays): its keys would be
    their cross product."""


class DocumentTooLarge(InvalidInput):
    """A document is over ``Limits.document_bytes_max``."""


class TransactionTooLarge(InvalidInput):
    """A transaction's ops are over ``Limits.transaction_bytes_max``."""


class InvalidName(InvalidInput):
    """A database, collection or index name that is not allowed."""


class InvalidFilter(InvalidInput):
    """A malformed filter or an unknown query operator."""


class InvalidUpdate(InvalidInput):
    """A malformed update or an unknown update operator."""


class ImmutableField(InvalidUpdate):
    """An update or replacement that would change ``_id`` (MongoDB's ImmutableField)."""


class ConflictingUpdateOperators(InvalidUpdate):
    """Two operators of one update on the same field, or one on a field inside
    the other's (MongoDB's ConflictingUpdateOperators)."""


class TypeMismatch(InvalidUpdate):
    """An arithmetic or bitwise operator given, or meeting, a value of the wrong
    type (``$inc`` of a string; MongoDB's TypeMismatch)."""


class PathNotViable(InvalidUpdate):
    """A path through a value that cannot have fields (``$set`` of "s.x" where
    ``s`` is a string; MongoDB's PathNotViable)."""


class UpdateBadValue(InvalidUpdate):
    """A well-formed update that cannot apply to the document it meets (``$push``
    onto a non-array, a positional ``$`` the filter did not match; MongoDB's
    BadValue)."""


class UpdateOverflow(InvalidUpdate):
    """An ``$inc`` or ``$mul`` whose integer result does not fit its type (a
    long past 64 signed bits): nothing is changed (MongoDB's BadValue)."""


class InvalidOperation(InvalidInput):
    """An operation that does not make sense here (drop a missing index...)."""


class IllegalOperation(InvalidOperation):
    """An operation MongoDB refuses as IllegalOperation (renaming a collection
    to itself)."""


class IndexOptionsConflict(InvalidOperation):
    """An index with the same key already exists under another name (or
    with other options): MongoDB's IndexOptionsConflict (85)."""


class IndexKeySpecsConflict(InvalidOperation):
    """An index of that name already exists with another key or options:
    MongoDB's IndexKeySpecsConflict (86)."""


class DuplicateKey(InvalidInput):
    """Duplicate ``_id`` or a unique-index violation; the statement wrote nothing."""


class SchemaMismatch(InvalidInput):
    """Documents that do not fit one DataFrame/Arrow schema (``info['field']``)."""


class CollectionNotFound(InvalidInput):
    pass


class CollectionExists(InvalidInput):
    """A collection that must not exist yet does (a rename's target)."""


class IndexNotFound(InvalidInput):
    pass


# --- wire and replication input ------------------------------------------
class ProtocolError(RaymxError):
    """A malformed, oversized or unauthenticated frame on the client port."""


class AuthenticationFailed(ProtocolError):
    pass


class TLSError(ProtocolError):
    """TLS does not match between the driver and the member's client port: the
    port requires TLS and the driver connected without it (or the other way
    round), or the handshake failed (an untrusted certificate, a name that does
    not match it). Nothing was sent in clear text when the port requires TLS."""


class LimitExceeded(OperationFailure):
    """A resource a client may hold is used up (``info["limit"]``: the name of
    the ``Limits`` field, ``info["max"]``: its value). Nothing of the request
    was done; the connection stays usable, except when the refused thing is
    the connection itself (too many connections: it is closed after this
    answer). See ARCHITECTURE.md, "Client limits"."""


class CorruptEntry(RaymxError):
    """An oplog entry that does not decode or names an unknown op."""


class CorruptStore(RaymxError):
    """A member's files are not in a state raymx wrote: a damaged checkpoint,
    a data file missing beside its checkpoint, an LMDB whose layout the
    write-ahead log does not know. Nothing is written over them."""


class BatchRefused(RaymxError):
    """A replication batch with a gap, a broken hash chain or a bad entry."""


# --- replication state ----------------------------------------------------
class NotPrimary(AutoReconnect):
    """This member does not accept writes; retry on the primary."""

    retryable = True


class NotPrimaryOrSecondary(AutoReconnect):
    """This member serves no reads now (``info["state"]``: recovering, resync or
    synchronizing): its data may still be rolled back or replaced. Retry on
    another member (the driver does)."""

    retryable = True


class PrimaryUnavailable(ServerSelectionTimeoutError):
    """No primary is reachable right now (an election may be running)."""

    retryable = True


class WriteConcernTimeout(OperationFailure):
    """The write committed (``info['gtid']``) but was not acknowledged in time.

    It is not undone: a timeout is not a rollback.
    """


class UnsatisfiableWriteConcern(WriteConcernTimeout):
    """The write committed (``info['gtid']``), but its ``w`` asks for more
    members than the set has: answered at once, not after a timeout
    (MongoDB's UnsatisfiableWriteConcern)."""


class ReadConcernTimeout(OperationFailure):
    """The member did not apply the requested GTID within the timeout (or,
    for a majority read, did not know it majority-committed)."""


class ExecutionTimeout(OperationFailure):
    """A read ran past its time limit (``max_time_ms``, MongoDB's
    ``maxTimeMS``: the time its batches took in all); its cursor is closed.
    pymongo's name."""


class Interrupted(OperationFailure):
    """An operator stopped the read (MongoDB's ``killOp``); its cursor is closed."""


class StaleRead(ServerSelectionTimeoutError):
    """No member satisfies the read's max-staleness bound."""


class Diverged(RaymxError):
    """The caller's position is not in this oplog with the same hash."""


class TooStale(RaymxError):
    """The requested position was trimmed from the oplog: resync needed."""


class OplogTrimmed(TooStale):
    """A resume token or revert target older than the oplog's first entry.

    ``info["oldest"]`` is the oldest GTID still available (the oplog's first
    entry): a change stream can resume from any token at or after the entry
    before it; a revert can go back to it.
    """


class ArchiveError(RaymxError):
    """The oplog archive cannot be written or read as asked (names what and
    where); while it cannot be written, trimming is held (nothing is lost)."""


class StaleTerm(RaymxError):
    """A message from a lower term than this member has durably recorded."""


class IrreversibleOp(RaymxError):
    """Rollback or revert across an op that cannot be undone."""


class ShutDown(AutoReconnect):
    """The member or replica set is shutting down or shut down."""

    retryable = True


class ConnectionLost(AutoReconnect):
    """The connection dropped; the outcome of an in-flight write is unknown."""

    retryable = True


class RequestTimeout(AutoReconnect, TimeoutError):
    """No answer in time (``info``: ``request_id``; for a write ``outcome:
    "unknown"``: it may still be applied, as with a lost connection)."""

    @property
    def request_id(self):
        return self.info.get("request_id")


class TransactionAborted(OperationFailure):
    """The transaction was aborted (timeout, conflict, member change)."""


class WriteConflict(TransactionAborted):
    """Another commit changed what an interactive transaction wrote (or a
    collection it used) after the transaction began, or another open
    transaction already wrote that document: this one is aborted, nothing of
    it stored; run it again (MongoDB's WriteConflict, a transient error)."""


class DiskFailed(RaymxError):
    """A sync (fsync) of the member's files failed. What it covered may not be
    on disk, and a retry could report success over lost pages (PostgreSQL's
    "fsyncgate"), so the member stops instead: nothing after it is
    acknowledged as durable; a restart recovers from what reached the disk."""


class DiskFull(OperationFailure):
    """A write was refused because there is no room for it; nothing of it was
    written, and what was stored before is intact.

    ``info["full"]`` says what is full: ``"disk"`` (the file system holding
    the member's folder: ENOSPC, or a short write of the data file while the
    file system has under 64 MiB free) or ``"map"`` (the LMDB map, the largest
    size the data file may reach in this process; ``info["map_bytes"]``).
    ``info["path"]`` is the member's folder. The write transaction was
    aborted; reads go on, and writes work again once there is room, with no
    restart: free space on the disk (drop or trim data, delete other files,
    grow the file system) or, for the map, restart the member with a larger
    ``Limits.map_bytes``.

    The map grows by itself (``LMDBStore``; ARCHITECTURE.md, "Disk full and
    map full"): (1) when a store is opened and its data file already uses
    over 3/4 of the map, the map is opened at twice the file's used size;
    (2) once a commit leaves the file past 3/4 of the map, and (3) after a
    map-full refusal, the next transaction this process begins doubles the
    map first, once no other transaction of this process is open (LMDB may
    only resize a map with none; open ones get 0.1 s to end, idle cursors
    are closed, else a begin a second later tries again). None goes past
    ``map_bytes_max``
    (default 4 TiB of address space). The member's other processes adopt a
    grown map at their next transaction the same way. Not retried
    automatically: the caller decides (a retry after a map grew may succeed)."""


class ConfigError(RaymxError):
    """An invalid replica set spec or limit."""


class BulkWriteError(OperationFailure):
    """``bulk_write`` stopped at (ordered) or went past (unordered) statements
    the member refused. ``details`` (also ``info``) is pymongo's shape:
    ``writeErrors`` (each ``index`` in the request list, ``code``: the raymx
    class name, ``errmsg``, ``op``), ``nInserted``, ``nMatched``,
    ``nModified``, ``nRemoved``, ``nUpserted``, ``upserted`` and ``gtids``:
    what was written before (and, unordered, after) the refusals stays
    written, each statement under its own GTID."""

    @property
    def details(self) -> dict:
        return self.info


# pymongo's names for raymx classes of the same meaning: the same objects
PyMongoError = RaymxError
DuplicateKeyError = DuplicateKey
NotPrimaryError = NotPrimary
WTimeoutError = WriteConcernTimeout
NetworkTimeout = RequestTimeout
ConfigurationError = ConfigError


def _all() -> dict[str, type[RaymxError]]:
    out = {}
    stack = [RaymxError]
    while stack:
        c = stack.pop()
        out[c.__name__] = c
        stack.extend(c.__subclasses__())
    return out


def from_wire(d: dict) -> RaymxError:
    """Rebuild an error sent by ``RaymxError.to_wire``; unknown names become RaymxError."""
    cls = _all().get(d.get("err"), RaymxError)
    e = cls(d.get("msg", ""), **(d.get("info") or {}))
    return e
