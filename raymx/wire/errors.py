"""raymx errors as MongoDB error documents (codes and shapes as MongoDB 7),
so drivers raise what they raise against MongoDB: 11000 -> DuplicateKeyError,
10107 -> NotPrimaryError (and a rediscovery), 64 with ``errInfo.wtimeout`` ->
WTimeoutError."""
from __future__ import annotations

import logging

from raymx import errors
from raymx.storage import numbers

log = logging.getLogger("raymx.wire")

# (code, codeName) by raymx class, most specific first
_CODES: list[tuple[type, int, str]] = [
    (errors.DuplicateKey, 11000, "DuplicateKey"),
    (errors.DocumentTooLarge, 10334, "BSONObjectTooLarge"),
    (errors.TransactionTooLarge, 10334, "BSONObjectTooLarge"),
    (errors.InvalidName, 73, "InvalidNamespace"),
    (errors.InvalidFilter, 2, "BadValue"),
    (errors.UpdateOverflow, 2, "BadValue"),
    (errors.UpdateBadValue, 2, "BadValue"),
    (errors.ImmutableField, 66, "ImmutableField"),
    (errors.ConflictingUpdateOperators, 40, "ConflictingUpdateOperators"),
    (errors.TypeMismatch, 14, "TypeMismatch"),
    (errors.PathNotViable, 28, "PathNotViable"),
    (errors.InvalidUpdate, 9, "FailedToParse"),
    (errors.CollectionNotFound, 26, "NamespaceNotFound"),
    (errors.CollectionExists, 48, "NamespaceExists"),
    (errors.IndexNotFound, 27, "IndexNotFound"),
    (errors.IndexOptionsConflict, 85, "IndexOptionsConflict"),
    (errors.IndexKeySpecsConflict, 86, "IndexKeySpecsConflict"),
    (errors.CannotIndexParallelArrays, 171, "CannotIndexParallelArrays"),
    (errors.IllegalOperation, 20, "IllegalOperation"),
    (errors.InvalidDocument, 2, "BadValue"),
    (errors.InvalidOperation, 2, "BadValue"),
    (errors.InvalidInput, 2, "BadValue"),
    (errors.AuthenticationFailed, 18, "AuthenticationFailed"),
    (errors.NotPrimary, 10107, "NotWritablePrimary"),
    (errors.NotPrimaryOrSecondary, 13436, "NotPrimaryOrSecondary"),
    (errors.PrimaryUnavailable, 189, "PrimarySteppedDown"),
    (errors.UnsatisfiableWriteConcern, 100, "UnsatisfiableWriteConcern"),
    (errors.WriteConcernTimeout, 64, "WriteConcernFailed"),
    (errors.ReadConcernTimeout, 50, "MaxTimeMSExpired"),
    (errors.ExecutionTimeout, 50, "MaxTimeMSExpired"),
    (errors.Interrupted, 11601, "Interrupted"),
    (errors.RequestTimeout, 50, "MaxTimeMSExpired"),
    (errors.WriteConflict, 112, "WriteConflict"),
    (errors.TransactionAborted, 251, "NoSuchTransaction"),
    (errors.DiskFull, 14031, "OutOfDiskSpace"),
    (errors.ShutDown, 91, "ShutdownInProgress"),
    # a failed sync stops the member (its outcome unknown): drivers look for
    # another primary and retry what is safe to retry, as after a shutdown
    (errors.DiskFailed, 91, "ShutdownInProgress"),
    (errors.StaleRead, 133, "FailedToSatisfyReadPreference"),
    (errors.OplogTrimmed, 286, "ChangeStreamHistoryLost"),
    (errors.LimitExceeded, 96, "OperationFailed"),  # errmsg names the Limits field
    (errors.RetryRecorded, 225, "TransactionTooOld"),
    (errors.ConnectionFailure, 6, "HostUnreachable"),  # retryable, as a lost connection
]


class CommandError(errors.RaymxError):
    """An error with a MongoDB code, raised by the wire layer itself."""

    def __init__(self, msg: str, code: int, code_name: str, **extra):
        super().__init__(msg)
        self.code, self.code_name, self.extra = code, code_name, extra


# MongoDB commands that raymx does another way: what to use instead
_INSTEAD = {
    "replsetreconfig": "raymx starts and stops its members itself: add or remove one with "
                       "rs.add_member() / rs.remove_member() (raymx add-member / "
                       "remove-member), change votes, priority, hidden or delay_s with "
                       "rs.reconfigure_member()",
    "replsetinitiate": "a set is initiated when it is launched (raymx.ReplicaSet.launch, "
                       "raymx launch)",
    "replsetfreeze": "elections choose the most advanced eligible member; give a member "
                     "priority 0 with rs.reconfigure_member() to keep it from being elected",
    "replsetsyncfrom": "set a member's sync_source with rs.reconfigure_member()",
    "replsetmaintenance": "stop a member with rs.kill_member() and start it again with "
                          "rs.start_member()",
    "shutdown": "stop the whole set with rs.shutdown() (raymx shutdown), one member with "
                "rs.kill_member()",
    "createuser": "a set has one user, 'raymx', whose password is the set's secret (raymx "
                  "url --mongodb)",
    "mapreduce": "use aggregate",
}


def command_not_found(name: str) -> CommandError:
    hint = _INSTEAD.get(name.lower())
    return CommandError(f"no such command: '{name}'" + (f"; {hint}" if hint else ""), 59,
                        "CommandNotFound")


def integer(cmd: dict, field: str) -> int:
    """A command's count field (``limit``, ``skip``, ``batchSize``; 0 when
    absent or null): an int, a long or a double with no fraction, as MongoDB's
    parser takes; anything else refused naming the field (``int()`` of it
    read "x" as an error of the server's, NaN and infinity too)."""
    v = cmd.get(field)
    if v is None:
        return 0
    if numbers.whole(v):
        return int(v)
    where = f"BSON field '{next(iter(cmd))}.{field}'"
    if numbers.is_number(v):
        raise CommandError(f"{where} must be an integer, not {v!r:.40}", 2, "BadValue")
    kind = {str: "string", list: "array", dict: "object", bool: "bool"}.get(type(v),
                                                                        type(v).__name__)
    raise CommandError(f"{where} is the wrong type '{kind}', expected a number", 14,
                       "TypeMismatch")


def bad_value(msg: str) -> CommandError:
    return CommandError(msg, 2, "BadValue")


def type_mismatch(msg: str) -> CommandError:
    return CommandError(msg, 14, "TypeMismatch")


def code_of(e: Exception) -> tuple[int, str]:
    if isinstance(e, CommandError):
        return e.code, e.code_name
    for cls, code, name in _CODES:
        if isinstance(e, cls):
            return code, name
    return 1, "InternalError"


def error_doc(e: Exception) -> dict:
    """The top-level answer of a failed command: ``{ok: 0, errmsg, code, codeName}``."""
    if not isinstance(e, errors.RaymxError):
        log.exception("wire command failed", exc_info=e)
        return {"ok": 0.0, "errmsg": f"internal error: {type(e).__name__}: {e}",
                "code": 1, "codeName": "InternalError"}
    code, name = code_of(e)
    out = {"ok": 0.0, "errmsg": e.msg or str(e), "code": code, "codeName": name}
    if isinstance(e, CommandError):
        out.update(e.extra)
    if code in (10107, 13436, 189, 91):  # drivers retry these (a retryable write)
        out["errorLabels"] = ["RetryableWriteError"]
    elif code in (251, 112):  # the transaction was aborted (a conflict, idle): run it again
        out.setdefault("errorLabels", ["TransientTransactionError"])
    return out


def write_error(index: int, e: Exception) -> dict:
    """One entry of ``writeErrors``: ``{index, code, codeName, errmsg}`` (and
    ``keyPattern``/``keyValue`` for a duplicate key)."""
    code, name = code_of(e)
    out = {"index": index, "code": code, "codeName": name,
           "errmsg": getattr(e, "msg", None) or str(e)}
    if isinstance(e, errors.DuplicateKey):
        pattern = e.info.get("key_pattern") or [["_id", 1]]
        out["keyPattern"] = {p: d for p, d in pattern}
        out["keyValue"] = dict(e.info.get("key_value") or {})
        out["errmsg"] = (f"E11000 duplicate key error collection: {e.info.get('ns')} "
                         f"index: {e.info.get('index')} dup key: {out['keyValue']!r:.200}")
    return out


def write_concern_error(e: Exception) -> dict:
    """``writeConcernError``: the write committed, its write concern did not hold."""
    code, name = code_of(e)
    out = {"code": code, "codeName": name, "errmsg": getattr(e, "msg", None) or str(e)}
    if code == 64:  # a timeout (not UnsatisfiableWriteConcern's 100)
        out["errInfo"] = {"wtimeout": True}
    return out


def is_statement_error(e: Exception) -> bool:
    """Errors that belong to one statement (``writeErrors``), not to the command."""
    return isinstance(e, errors.InvalidInput)


def is_primary_error(e: Exception) -> bool:
    """The member cannot take the write at all: the command fails (drivers retry)."""
    return isinstance(e, (errors.NotPrimary, errors.PrimaryUnavailable, errors.ShutDown,
                          errors.NotPrimaryOrSecondary))
