"""The wire protocol of ebb's Arrow Flight service: tickets, descriptors and stream metadata.

A ticket (and a command descriptor) is a small JSON object that names a read, never a file:

    {"kind": "probe",       "key": 42,            "as_of": 1200}
    {"kind": "probe_many",  "keys": [42, 7, 42],  "as_of": 1200}
    {"kind": "probe_range", "lo": 10, "hi": 20,   "as_of": null}
    {"kind": "scan",                              "as_of": null}

``as_of`` is optional (default: the time of the last update of the snapshot the server reads).
``lo``/``hi`` may be null for an open bound. Keys must be JSON integers for an archive with integer
keys and JSON strings for one with string keys. ``probe_many`` answers the probe of each of up
to ``MAX_PROBE_KEYS`` keys in one stream, ordered by (key, exp, ts), each key once. Anything else (unknown kinds or fields, a
``path``) is rejected with a ``BadRequest`` that names the problem: the server only ever serves
the archive it was started with.

The first chunk of every ``do_get`` stream carries ``app_metadata``: a JSON object with the
committed state the answer was read from (``update_seq``, ``last_update_time``) and ``as_of``.
This module has no Flight dependency so that both ends share it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..storage.errors import ReadError
from ..storage.keys import MAX_STRING_KEY_BYTES, is_int_key, search_key

KINDS = ("probe", "probe_many", "probe_range", "scan")
# a ticket is a few dozen bytes, or for probe_many up to MAX_PROBE_KEYS keys; refuse to parse more JSON
MAX_PROBE_KEYS = 100_000
MAX_TICKET_BYTES = 4 << 20
_FIELDS = {"probe": {"key"}, "probe_many": {"keys"}, "probe_range": {"lo", "hi"}, "scan": set()}
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class BadRequest(ReadError):
    """A ticket or descriptor the server cannot serve; the message says why. A ReadError (a read
    that cannot be answered as asked): the server answers it, like any ReadError, with a
    FlightServerError ("ebb: bad request: ...")."""


@dataclass(frozen=True)
class ReadRequest:
    """One parsed read: what to read and as of when (None: the snapshot's last update)."""

    kind: str
    as_of: int | None = None
    key: Any = None
    lo: Any = None
    hi: Any = None
    keys: tuple = ()

    def to_json(self) -> dict:
        """The ticket's JSON object; numpy or Arrow scalars (keys or times taken from an array) as the
        values they hold, which JSON can encode."""
        out: dict[str, Any] = {"kind": self.kind}
        for name in sorted(_FIELDS[self.kind]):
            v = getattr(self, name)
            out[name] = [search_key(k) for k in v] if name == "keys" else search_key(v)
        if self.as_of is not None:
            out["as_of"] = search_key(self.as_of)
        return out

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True).encode()


def _int(name: str, v: Any) -> int:
    # bool is an int subclass in Python; a JSON true is not a time
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{name} must be an integer number of chronons, got {json.dumps(v)}")
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise BadRequest(f"{name} {v} does not fit in int64")
    return v


def decode(raw: bytes) -> ReadRequest:
    """Parses and checks a ticket's shape (not yet against an archive; see ``check_keys``)."""
    if len(raw) > MAX_TICKET_BYTES:
        raise BadRequest(f"ticket of {len(raw)} bytes is too long (at most {MAX_TICKET_BYTES})")
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"ticket is not valid JSON ({e}); expected e.g. {{\"kind\": \"probe\", \"key\": 42}}") from None
    except RecursionError:  # e.g. 30,000 nested arrays: json recurses once per level
        raise BadRequest("ticket is nested too deeply; expected a flat JSON object such as {\"kind\": \"scan\"}") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"ticket must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("kind")
    if kind not in KINDS:
        raise BadRequest(f"unknown ticket kind {json.dumps(kind)}; expected one of {', '.join(KINDS)}")
    if "path" in obj:
        raise BadRequest("a ticket cannot name a path: this server serves only the archive it was started with")
    allowed = _FIELDS[kind] | {"kind", "as_of"}
    extra = sorted(set(obj) - allowed)
    if extra:
        raise BadRequest(f"unknown field(s) {', '.join(extra)} in a {kind} ticket; allowed: {', '.join(sorted(allowed))}")
    as_of = obj.get("as_of")
    if as_of is not None:
        as_of = _int("as_of", as_of)
    if kind == "probe":
        if "key" not in obj or obj["key"] is None:
            raise BadRequest("a probe ticket needs a non-null \"key\"")
        return ReadRequest(kind, as_of, key=obj["key"])
    if kind == "probe_many":
        keys = obj.get("keys")
        if not isinstance(keys, list):
            raise BadRequest("a probe_many ticket needs \"keys\": a JSON list of keys")
        if len(keys) > MAX_PROBE_KEYS:
            raise BadRequest(f"a probe_many ticket holds at most {MAX_PROBE_KEYS} keys, got {len(keys)}")
        return ReadRequest(kind, as_of, keys=tuple(keys))
    if kind == "probe_range":
        return ReadRequest(kind, as_of, lo=obj.get("lo"), hi=obj.get("hi"))
    return ReadRequest(kind, as_of)


def check_key(name: str, value: Any, key_type: pa.DataType, nullable: bool = False) -> Any:
    """``value`` as a key of the archive's key type, or BadRequest naming the mismatch."""
    if value is None:
        if nullable:
            return None
        raise BadRequest(f"{name} must not be null")
    if is_int_key(key_type):
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"{name} must be an integer: the archive's keys are {key_type}, got {json.dumps(value)}")
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise BadRequest(f"{name} {value} does not fit in int64")
        return value
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string: the archive's keys are {key_type}, got {json.dumps(value)}")
    if len(value.encode()) > MAX_STRING_KEY_BYTES:
        raise BadRequest(f"{name} is longer than {MAX_STRING_KEY_BYTES} bytes of UTF-8, the longest key an archive can hold")
    return value


def check_keys(values: tuple, key_type: pa.DataType) -> tuple:
    """``values`` as keys of the archive's key type, or BadRequest naming the first mismatch
    (one pass over the parsed JSON values, which the JSON parser made one by one anyway)."""
    if is_int_key(key_type):
        bad = next((v for v in values if type(v) is not int or not _INT64_MIN <= v <= _INT64_MAX), None)
        if bad is not None or any(v is None for v in values):
            raise BadRequest(f"keys must be integers within int64: the archive's keys are {key_type}, got {json.dumps(bad)}")
        return values
    bad = next((v for v in values if type(v) is not str or len(v) > MAX_STRING_KEY_BYTES // 4
                and len(v.encode()) > MAX_STRING_KEY_BYTES), None)
    if bad is not None or any(v is None for v in values):
        raise BadRequest(f"keys must be strings of at most {MAX_STRING_KEY_BYTES} bytes of UTF-8: the archive's keys are "
                         f"{key_type}, got {json.dumps(bad)[:80]}")
    return values


def stream_metadata(update_seq: int, last_update_time: int | None, as_of: int) -> bytes:
    """``app_metadata`` of a stream's first chunk: which committed state answered."""
    return json.dumps({"update_seq": update_seq, "last_update_time": last_update_time, "as_of": as_of}).encode()
