"""SCRAM-SHA-256 (RFC 7677) for the wire port, the server side, as MongoDB's
``saslStart``/``saslContinue``. The one user is ``raymx`` (any
authentication database) and its password is the replica set's secret.

Pure code: the caller keeps a ``Scram`` per connection.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os

from raymx.wire.errors import CommandError

USER = "raymx"
MECHANISM = "SCRAM-SHA-256"
ITERATIONS = 15000  # MongoDB's default for SCRAM-SHA-256


def _failed(why: str) -> CommandError:
    return CommandError(f"Authentication failed: {why}", 18, "AuthenticationFailed")


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


class Credential:
    """The keys derived from the secret, once per member (PBKDF2 is slow on purpose)."""

    def __init__(self, secret: str, salt: bytes | None = None):
        self.salt = salt or os.urandom(28)
        salted = hashlib.pbkdf2_hmac("sha256", secret.encode(), self.salt, ITERATIONS)
        self.stored_key = hashlib.sha256(_hmac(salted, b"Client Key")).digest()
        self.server_key = _hmac(salted, b"Server Key")


def _fields(msg: str) -> dict:
    out = {}
    for part in msg.split(","):
        k, eq, v = part.partition("=")
        if eq and len(k) == 1:
            out.setdefault(k, v)
    return out


class Scram:
    """One connection's conversation: ``start`` then ``finish``."""

    def __init__(self, cred: Credential):
        self.cred = cred
        self.first_bare = self.server_first = self.nonce = None
        self.user: str | None = None

    def start(self, mechanism, payload: bytes) -> bytes:
        if mechanism != MECHANISM:
            raise CommandError(f"Received authentication for mechanism {mechanism} which is "
                               f"not enabled (raymx offers {MECHANISM})", 334,
                               "MechanismUnavailable")
        try:
            msg = bytes(payload).decode()
        except (UnicodeDecodeError, TypeError):
            raise _failed("the SCRAM client-first message is not UTF-8") from None
        if not msg.startswith(("n,,", "n,a=", "y,")):
            raise _failed("malformed SCRAM client-first message")
        self.first_bare = msg.split(",", 2)[2] if msg.count(",") >= 2 else ""
        f = _fields(self.first_bare)
        user = f.get("n", "").replace("=2C", ",").replace("=3D", "=")
        if not f.get("r"):
            raise _failed("SCRAM client-first message without a nonce")
        self.user = user
        self.nonce = f["r"] + base64.b64encode(os.urandom(24)).decode()
        self.server_first = (f"r={self.nonce},s={base64.b64encode(self.cred.salt).decode()},"
                             f"i={ITERATIONS}")
        return self.server_first.encode()

    def finish(self, payload: bytes) -> bytes:
        """Check the client's proof; the server signature to send back."""
        if self.server_first is None:
            raise _failed("saslContinue before saslStart")
        try:
            msg = bytes(payload).decode()
        except (UnicodeDecodeError, TypeError):
            raise _failed("the SCRAM client-final message is not UTF-8") from None
        without_proof, _, proof_part = msg.rpartition(",p=")
        f = _fields(without_proof)
        if f.get("r") != self.nonce or not proof_part:
            raise _failed("SCRAM nonce mismatch")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise _failed("SCRAM proof is not base64") from None
        auth_msg = f"{self.first_bare},{self.server_first},{without_proof}".encode()
        sig = _hmac(self.cred.stored_key, auth_msg)
        if len(proof) != len(sig):
            raise _failed("SCRAM proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, sig))
        if self.user != USER or not hmac.compare_digest(
                hashlib.sha256(client_key).digest(), self.cred.stored_key):
            raise _failed(f"user {self.user!r} or its password is not known here")
        server_sig = _hmac(self.cred.server_key, auth_msg)
        return b"v=" + base64.b64encode(server_sig)
