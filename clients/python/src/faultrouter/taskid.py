"""Deterministic task IDs, byte for byte those of faultrouter's Go generator (pkg/taskid).

An ID is "t1-" and 26 characters of lowercase unpadded base32 of the first 130 bits of
SHA-256(field("faultrouter.taskid.v1") || field(user) || field(action) ||
field(authorization) || field(SHA-256(content))), where field(x) is len(x) as 8 bytes
big-endian followed by x. No clock and no randomness: the same submission always gets the
same ID, so a resubmitted task is recognised as the same task.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from typing import BinaryIO

PREFIX = "t1-"
_DOMAIN = b"faultrouter.taskid.v1"
_CHARS = 26


def _field(b: bytes) -> bytes:
    return struct.pack(">Q", len(b)) + b


def _from_digest(content_sha256: bytes, user: str, action: str, authorization: str) -> str:
    digest = hashlib.sha256(
        _field(_DOMAIN) + _field(user.encode()) + _field(action.encode())
        + _field(authorization.encode()) + _field(content_sha256)
    ).digest()
    return PREFIX + base64.b32encode(digest).decode().lower()[:_CHARS]


def task_id(content: bytes | str | BinaryIO, *, user: str, action: str, authorization: str = "") -> str:
    """The task ID of content submitted by user for action, under authorization (an
    approval's ID, separating two separately approved identical operations; "" for none).

    content is bytes, a str (taken as UTF-8) or a binary file object read to its end.
    Strings are taken byte for byte: no case folding, no Unicode normalisation.
    """
    for name, value in (("user", user), ("action", action), ("authorization", authorization)):
        if not isinstance(value, str):
            raise TypeError(f"task_id: {name} must be a str, not {type(value).__name__}")
    if not user:
        raise ValueError("task_id: user is empty; give the submitting user's ID")
    if not action:
        raise ValueError("task_id: action is empty; give the business action, e.g. refund")
    h = hashlib.sha256()
    if isinstance(content, str):
        h.update(content.encode())
    elif isinstance(content, (bytes, bytearray, memoryview)):
        h.update(content)
    else:
        for chunk in iter(lambda: content.read(1 << 16), b""):
            h.update(chunk)
    return _from_digest(h.digest(), user, action, authorization)
