"""raymx.errors: every error a user or an operator can see (the public name).

The classes are defined in ``raymx.storage.errors``, the bottom layer: the
storage engine raises them, and ``raymx.storage`` must not import the
user-facing ``raymx`` package above it. This module re-exports every public
name from there, so ``raymx.errors.X is raymx.storage.errors.X`` for every
class (``except``, ``isinstance``, pickling and ``from_wire`` see one class,
whichever name raised it). Use ``raymx.errors`` outside ``raymx.storage``;
add new errors in raymx/storage/errors.py and list them in its ``__all__``.
"""
from __future__ import annotations

from raymx.storage.errors import *  # noqa: F401,F403  (the names in __all__)
from raymx.storage.errors import __all__  # noqa: F401  (one list, kept there)
