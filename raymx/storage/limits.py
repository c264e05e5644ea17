"""Every limit in one place, units last. Relations between them are checked once."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from raymx.storage.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


_MAY_BE_ZERO = frozenset({"port_busy_poll_us"})  # 0 turns it off; every other limit is > 0


@dataclass(frozen=True)
class Limits:
    # Documents and transactions (DESIGN section 10).
    document_bytes_max: int = 16 * MiB
    transaction_bytes_max: int = 512 * MiB
    # A transaction's ops spill to oplog.refs past this many bytes, in chunks
    # of at most this many, so a large transaction does not sit in memory; the
    # oplog entry then holds a reference. Under a 4 KiB LMDB page a value of
    # up to 4,080 bytes takes one page: with this, an oplog entry or chunk
    # never needs a run of free pages, which LMDB finds by scanning its free
    # list (in a database that has freed many pages, 1 MiB entries made a
    # 1,000-document insert_many 2.3x slower)
    spill_bytes: int = 4000
    name_chars_max: int = 120
    # LMDB map: virtual address space, not disk; raise it for big data sets.
    # It grows by itself where that is safe (LMDBStore; a full one refuses
    # writes with DiskFull).
    map_bytes: int = 64 * GiB
    # Client port: one frame never exceeds this (a document plus overhead).
    frame_bytes_max: int = 48 * MiB
    cursor_batch_docs: int = 1000
    cursor_batch_bytes: int = 4 * MiB
    # A cursor nobody asked for more within this long is closed (each open one
    # holds an LMDB read snapshot; as MongoDB's cursorTimeoutMillis).
    cursor_idle_ms: int = 600_000
    # Group commit: default (j=False) writes are synced within this interval.
    sync_interval_ms: int = 100
    # Autocommit writes queued together run as one LMDB transaction (each
    # still its own GTID): at most this many share one commit.
    write_group_max: int = 64
    # Autocommit inserts of at most this many documents (and updates and
    # deletes of one document by _id) run on the client port's thread when
    # the writer thread is idle: no hand-off between threads; the rest go to
    # the writer thread.
    port_insert_docs_max: int = 64
    # Interactive transactions: each holds a read snapshot (an LMDB reader
    # slot, and the pages it sees) and the documents it wrote (another
    # transaction writing one fails with WriteConflict) until it ends: aborted
    # after this long, or when no statement came for transaction_idle_ms
    # (as MongoDB's transactionLifetimeLimitSeconds); at most
    # transactions_max open on a member.
    transaction_lifetime_ms: int = 60_000
    transaction_idle_ms: int = 60_000
    transactions_max: int = 256
    # Applier batches (DESIGN section 4).
    apply_batch_ms: int = 1000
    apply_batch_ops: int = 5000
    apply_batch_bytes: int = 100 * MiB
    # A member more than this many entries behind its last written entry
    # catches up by parallel replay (last image per document, DESIGN 8)
    # instead of applying entry by entry; at most replay_entries_max per round,
    # written in transactions of at most replay_txn_docs_max documents.
    replay_entries_min: int = 10_000
    replay_entries_max: int = 500_000
    replay_txn_docs_max: int = 100_000
    # Snapshot copies (initial sync): rows per partition of docs and index; a
    # synchronizing member gets its votes once this close to the primary.
    snapshot_part_rows: int = 50_000
    join_lag_entries: int = 1000
    # Feeder pulls.
    pull_entries_max: int = 5000
    pull_bytes_max: int = 16 * MiB
    pull_wait_ms: int = 500
    # A pull with no new entries but a newer majority point waits this long
    # for entries before answering with the point alone.
    majority_linger_ms: int = 20
    # Elections and heartbeats.
    heartbeat_interval_ms: int = 100
    heartbeat_timeout_ms: int = 600
    rollback_ops_max: int = 100_000
    # Oplog trimming (DESIGN section 3): the default cap of a replica set's
    # oplogs (change it per set with ReplicaSet.set_oplog_cap, also by age),
    # how often each member checks it, and the entries one trim transaction
    # may drop (writers wait at most for one such transaction).
    oplog_bytes_max: int = 1 * GiB
    trim_interval_ms: int = 1000
    # how often the primary deletes what its TTL indexes expired (MongoDB's
    # TTL monitor runs every 60 s), on the trimmer's thread
    ttl_interval_ms: int = 60_000
    trim_batch_entries: int = 500
    # Change streams: events per answer and how long a quiet watch waits.
    watch_batch_max: int = 1000
    watch_wait_ms: int = 500
    # What one client may hold (each refused with LimitExceeded naming the
    # limit, the connection kept; ARCHITECTURE.md, "Client limits"):
    # connections to one member's client port (past it a new connection gets
    # the error and is closed), and connections from one peer address that
    # have not sent their hello yet (all Unix-socket peers count as one);
    connections_max: int = 4096
    unauthenticated_per_address_max: int = 64
    # open interactive transactions and multi-part inserts still arriving, per
    # connection (the driver uses one of each at a time per thread);
    transactions_per_connection_max: int = 16
    inserts_pending_per_connection_max: int = 16
    # levels of maps and arrays in a filter or an update (InvalidFilter /
    # InvalidUpdate): a document may nest 100 (codec.NESTING_MAX), and a
    # filter or update wraps it in a few operators; at most 200 (Python's
    # recursion limit is the ceiling);
    nesting_depth_max: int = 110
    # a read after a GTID (``after``) waits at most this long, and one
    # connection may have at most this many such reads waiting (a wait holds
    # no thread: it is parked until the applier reaches the GTID).
    after_timeout_ms_max: int = 60_000
    after_waits_per_connection_max: int = 256
    # Open cursors (each holds an LMDB read snapshot, and LMDB's reader table
    # has 1024 slots for all of the member's processes): per connection (a
    # find past it is refused), and per member (past it the least recently
    # used cursor is closed; its next getMore says so).
    cursors_per_connection_max: int = 64
    cursors_max: int = 512
    # After it read a frame or wrote an answer, a port's event loop keeps
    # polling its sockets for this long (epoll without waiting, giving the CPU
    # to any other runnable task each turn) before it sleeps: on a virtual
    # machine a thread woken from an idle CPU costs tens of microseconds more
    # on each side (ARCHITECTURE.md, "Busy polling"). An idle member never
    # polls; 0: the loop always sleeps. At most 10,000.
    port_busy_poll_us: int = 200

    def __post_init__(self):
        for k, v in asdict(self).items():
            least = 0 if k in _MAY_BE_ZERO else 1
            if type(v) is not int or v < least:  # bools are refused too
                kind = "non-negative" if least == 0 else "positive"
                raise ConfigError(f"limit {k} must be a {kind} integer, got {v!r}")
        if self.port_busy_poll_us > 10_000:
            raise ConfigError("port_busy_poll_us must be at most 10,000 (10 ms): past that a "
                              "quiet connection costs the member a core for nothing")
        if self.spill_bytes > self.transaction_bytes_max:
            raise ConfigError("spill_bytes must not exceed transaction_bytes_max")
        if self.document_bytes_max + 64 * KiB > self.frame_bytes_max:
            raise ConfigError("frame_bytes_max must exceed document_bytes_max by 64 KiB "
                              "(a frame carries one document plus overhead)")
        if self.replay_entries_max < self.replay_entries_min:
            raise ConfigError("replay_entries_max must be at least replay_entries_min")
        if self.nesting_depth_max > 200:
            raise ConfigError("nesting_depth_max must be at most 200 (filters and updates "
                              "are evaluated recursively)")
        if self.cursors_max > 768:
            raise ConfigError("cursors_max must be at most 768 (LMDB's reader table has 1024 "
                              "slots for the member's cursors, threads and processes)")
        if self.cursors_max + self.transactions_max > 896:
            raise ConfigError("cursors_max + transactions_max must be at most 896 (each holds "
                              "a slot of LMDB's reader table, 1024 for the whole member)")
        if self.heartbeat_timeout_ms <= self.heartbeat_interval_ms:
            raise ConfigError("heartbeat_timeout_ms must be greater than heartbeat_interval_ms")

    def with_(self, **kw) -> "Limits":
        unknown = set(kw) - set(asdict(self))
        if unknown:
            raise ConfigError(f"unknown limits: {sorted(unknown)}")
        return replace(self, **kw)


DEFAULT = Limits()


# read concern levels, as MongoDB's (driver and member check alike)
READ_CONCERNS = ("local", "majority", "linearizable", "snapshot")


def write_concern_problem(w, j, wtimeout_ms) -> str | None:
    """What is wrong with a write concern (driver and member check alike), or None.

    ``w``: members that must hold the entry, a non-negative int or
    ``"majority"``; ``j``: a bool; ``wtimeout_ms``: a non-negative number of
    milliseconds (0 or None: no limit). None stands for the default of each."""
    if w is not None and not (w == "majority" or (type(w) is int and w >= 0)):
        return f"w must be a non-negative int or 'majority', got {w!r}"
    if j is not None and type(j) is not bool:
        return f"j must be a bool, got {j!r}"
    if wtimeout_ms is not None and not (type(wtimeout_ms) in (int, float) and wtimeout_ms >= 0):
        return f"wtimeout_ms must be a non-negative number of milliseconds, got {wtimeout_ms!r}"
    return None
