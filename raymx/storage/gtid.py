"""GTID: (term, seq), stored as 16 bytes big-endian so byte order is GTID order.

``term`` changes only when the primary changes and is durable on every member
(TokuMX's primarySeqNumber). ``seq`` is dense across the whole replicated
history (JE's VLSN): a new primary continues at ``last.seq + 1``, never at 0,
so a gap check or a lag in entries is a subtraction.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

_S = struct.Struct(">QQ")
U64_MAX = (1 << 64) - 1


class GTID(NamedTuple):
    term: int
    seq: int

    def to_bytes(self) -> bytes:
        return _S.pack(self.term, self.seq)

    @classmethod
    def from_bytes(cls, b: bytes) -> "GTID":
        if len(b) != 16:
            raise ValueError(f"a GTID is 16 bytes, got {len(b)}")
        return cls(*_S.unpack(b))

    @classmethod
    def parse(cls, s: "str | GTID | tuple | list | bytes") -> "GTID":
        """Accept ``"3:1042"``, a GTID, a ``(term, seq)`` pair or 16 bytes."""
        if isinstance(s, GTID):
            return s
        if isinstance(s, (bytes, bytearray)):
            return cls.from_bytes(bytes(s))
        if isinstance(s, (tuple, list)) and len(s) == 2:
            t, q = int(s[0]), int(s[1])
        elif isinstance(s, str) and s.count(":") == 1:
            a, b = s.split(":")
            try:
                t, q = int(a), int(b)
            except ValueError:
                raise ValueError(f"not a GTID: {s!r} (expected 'term:seq')") from None
        else:
            raise ValueError(f"not a GTID: {s!r} (expected 'term:seq')")
        if not (0 <= t <= U64_MAX and 0 <= q <= U64_MAX):
            raise ValueError(f"GTID parts must be unsigned 64-bit: {s!r}")
        return cls(t, q)

    def __str__(self) -> str:
        return f"{self.term}:{self.seq}"

    def __repr__(self) -> str:
        return f"GTID({self.term}:{self.seq})"


ZERO = GTID(0, 0)
