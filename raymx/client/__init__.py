"""The driver: a pymongo-shaped client over the members' client ports.

Every name is importable from ``raymx.client``; the modules, from the wire up:

- ``connection``: ``Connection``, one pipelined connection to a member shared
  by threads, and ``connect_member`` (Unix socket on the same machine, else TCP);
- ``options``: ``WriteConcern``, ``ReadPreference``, ``ReadConcern``;
- ``results``: ``InsertOneResult``, ``InsertManyResult``, ``UpdateResult``,
  ``ReplaceManyResult``, ``DeleteResult``;
- ``results``' ``BulkWriteResult`` and ``options``' ``ReturnDocument``;
- ``cursor``: ``Cursor``, an iterator over a query's results;
- ``composite``: ``distinct`` and findAndModify from the member's requests
  (shared with the wire port);
- ``bulk``: ``bulk_write``'s requests, ``InsertOne`` ... ``DeleteMany``;
- ``collection``: ``Database``, ``Collection`` (writes and reads);
- ``change_stream``: ``ChangeStream``;
- ``client``: ``Client`` (follows the primary through elections) and
  ``ClientTransaction``;
- ``url``: ``parse_url``, ``URLTopology`` and ``connect_url``, a client from a
  ``raymx://`` URL without Ray.
"""
from __future__ import annotations

from raymx.client.change_stream import ChangeStream
from raymx.client.client import Client, ClientTransaction
from raymx.client.bulk import (DeleteMany, DeleteOne, InsertOne, ReplaceOne, UpdateMany,
                               UpdateOne)
from raymx.client.collection import INSERT_PART_BYTES, INSERT_PART_DOCS, Collection, Database
from raymx.client.cursor import Cursor
from raymx.client.connection import Connection, connect_member
from raymx.client.options import ReadConcern, ReadPreference, ReturnDocument, WriteConcern
from raymx.client.results import (BulkWriteResult, DeleteResult, InsertManyResult,
                                  InsertOneResult, ReplaceManyResult, UpdateResult)
from raymx.client.url import URLTopology, connect_url, parse_url

__all__ = ["Client", "ClientTransaction", "Database", "Collection", "Cursor", "ChangeStream",
           "Connection", "connect_member", "parse_url", "URLTopology", "connect_url",
           "WriteConcern", "ReadPreference", "ReadConcern", "InsertOneResult",
           "InsertManyResult", "UpdateResult", "ReplaceManyResult", "DeleteResult", "INSERT_PART_DOCS",
           "INSERT_PART_BYTES", "BulkWriteResult", "ReturnDocument", "InsertOne", "UpdateOne",
           "UpdateMany", "ReplaceOne", "DeleteOne", "DeleteMany"]
