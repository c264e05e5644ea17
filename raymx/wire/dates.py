"""Aggregation expressions over dates: date parts, ``$dateToString``,
``$dateFromString``, ``$dateToParts``/``$dateFromParts``,
``$dateAdd``/``$dateSubtract``, ``$dateDiff`` and ``$dateTrunc``, as MongoDB
computes them (``fn(arg, ev)``, as in ``expressions.py``, whose argument
helpers they use). Dates are BSON's: UTC,
to the millisecond (the port decodes them as naive UTC ``datetime``); a
``timezone`` is an Olson name or a ``+hh:mm`` offset.
"""
from __future__ import annotations

import calendar
import datetime
import re
import zoneinfo
from typing import Any, Callable

import bson

from raymx.wire.errors import CommandError
from raymx.wire.expressions import (EPOCH, _conversion, _date_of_ms, _err, _fields, _int_arg,
                                    _n, _named, _null, _type)

def _zone(tz):
    if _null(tz) or tz in ("UTC", "GMT", "Z"):
        return None
    if not isinstance(tz, str):
        raise _err(f"timezone must be a string, not {_type(tz)}", 40517)
    m = re.fullmatch(r"([+-])(\d\d):?(\d\d)", tz) or re.fullmatch(r"([+-])(\d\d)()", tz)
    if m:
        delta = datetime.timedelta(hours=int(m.group(2)), minutes=int(m.group(3) or 0))
        return datetime.timezone(-delta if m.group(1) == "-" else delta)
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise _err(f"unrecognized time zone identifier: \"{tz}\"", 40485) from None


def _local(d: datetime.datetime, tz) -> datetime.datetime:
    """``d`` (naive UTC) as wall-clock time in ``tz`` (naive)."""
    if tz is None:
        return d
    return d.replace(tzinfo=datetime.timezone.utc).astimezone(tz).replace(tzinfo=None)


def _utc(d: datetime.datetime, tz) -> datetime.datetime:
    """Wall-clock ``d`` in ``tz`` back to naive UTC."""
    if tz is None:
        return d
    return d.replace(tzinfo=tz).astimezone(datetime.timezone.utc).replace(tzinfo=None)


def _date_arg(x, ev, name: str):
    """(date or None for null, zone) of a date part operator's argument."""
    if isinstance(x, dict) and "date" in x and not any(k.startswith("$") for k in x):
        a = _fields(name, x, ("date",), ("timezone",))
        v, tz = ev(a["date"]), _zone(ev(a["timezone"])) if "timezone" in a else None
    else:
        (v,) = _n(name, x, ev, 1)
        tz = None
    if _null(v):
        return None, tz
    if isinstance(v, bson.ObjectId):
        v = v.generation_time.replace(tzinfo=None)
    elif isinstance(v, bson.timestamp.Timestamp):
        v = _date_of_ms(v.time * 1000)
    if not isinstance(v, datetime.datetime):
        raise _err(f"can't convert from BSON type {_type(v)} to Date", 16006)
    return _local(v, tz), tz


_PARTS = {
    "$year": lambda d: d.year, "$month": lambda d: d.month, "$dayOfMonth": lambda d: d.day,
    "$hour": lambda d: d.hour, "$minute": lambda d: d.minute, "$second": lambda d: d.second,
    "$millisecond": lambda d: d.microsecond // 1000,
    "$dayOfWeek": lambda d: d.isoweekday() % 7 + 1, "$dayOfYear": lambda d: d.timetuple().tm_yday,
    "$week": lambda d: int(d.strftime("%U")), "$isoWeek": lambda d: d.isocalendar()[1],
    "$isoWeekYear": lambda d: d.isocalendar()[0], "$isoDayOfWeek": lambda d: d.isoweekday(),
}


def _date_part(x, ev, name="$year"):
    d, _ = _date_arg(x, ev, name)
    return None if d is None else _PARTS[name](d)


_FORMAT = {
    "Y": lambda d: f"{d.year:04d}", "m": lambda d: f"{d.month:02d}",
    "d": lambda d: f"{d.day:02d}", "H": lambda d: f"{d.hour:02d}",
    "M": lambda d: f"{d.minute:02d}", "S": lambda d: f"{d.second:02d}",
    "L": lambda d: f"{d.microsecond // 1000:03d}", "j": lambda d: f"{d.timetuple().tm_yday:03d}",
    "w": lambda d: str(d.isoweekday() % 7 + 1), "u": lambda d: str(d.isoweekday()),
    "U": lambda d: d.strftime("%U"), "V": lambda d: f"{d.isocalendar()[1]:02d}",
    "G": lambda d: f"{d.isocalendar()[0]:04d}", "%": lambda d: "%",
}
DEFAULT_DATE_FORMAT = "%Y-%m-%dT%H:%M:%S.%LZ"


def _format_date(d: datetime.datetime, fmt: str, tz) -> str:
    out, i = [], 0
    while i < len(fmt):
        c = fmt[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        spec = fmt[i + 1:i + 2]
        if spec == "z" or spec == "Z":
            off = (tz.utcoffset(_utc(d, tz)) if tz is not None else datetime.timedelta(0))
            mins = int(off.total_seconds() // 60)
            out.append(f"{'+' if mins >= 0 else '-'}{abs(mins) // 60:02d}{abs(mins) % 60:02d}"
                       if spec == "z" else str(mins))
        elif spec in _FORMAT:
            out.append(_FORMAT[spec](d))
        else:
            raise _err(f"Invalid format character '%{spec}' in format string", 18536)
        i += 2
    return "".join(out)


def _date_to_string(x, ev, name="$dateToString"):
    a = _fields(name, x, ("date",), ("format", "timezone", "onNull"))
    v = ev(a["date"])
    if _null(v):
        return ev(a["onNull"]) if "onNull" in a else None
    tz = _zone(ev(a["timezone"])) if "timezone" in a else None
    if isinstance(v, bson.ObjectId):
        v = v.generation_time.replace(tzinfo=None)
    if not isinstance(v, datetime.datetime):
        raise _err(f"can't convert from BSON type {_type(v)} to Date", 16006)
    fmt = ev(a["format"]) if "format" in a else DEFAULT_DATE_FORMAT
    if not isinstance(fmt, str):
        raise _err("$dateToString requires that 'format' be a string", 18533)
    return _format_date(_local(v, tz), fmt, tz)


_STRPTIME = {"Y": "%Y", "m": "%m", "d": "%d", "H": "%H", "M": "%M", "S": "%S", "L": "%f",
             "j": "%j", "z": "%z", "%": "%%"}


def parse_date(s: str, fmt, tz) -> datetime.datetime:
    try:
        if fmt is None:
            t = s.strip().replace("Z", "+00:00")
            d = datetime.datetime.fromisoformat(t)
        else:
            pattern = re.sub(r"%(.)", lambda m: _STRPTIME.get(m.group(1), "%" + m.group(1)),
                             fmt)
            d = datetime.datetime.strptime(s, pattern)
    except ValueError as e:
        raise _conversion(f"Error parsing date string '{s}': {e}") from None
    if d.tzinfo is not None:
        return d.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return _utc(d, tz)


def _date_from_string(x, ev, name="$dateFromString"):
    a = _fields(name, x, ("dateString",), ("format", "timezone", "onError", "onNull"))
    s = ev(a["dateString"])
    if _null(s):
        return ev(a["onNull"]) if "onNull" in a else None
    tz = _zone(ev(a["timezone"])) if "timezone" in a else None
    fmt = ev(a["format"]) if "format" in a else None
    try:
        if not isinstance(s, str):
            raise _conversion(f"$dateFromString requires that 'dateString' be a string, "
                              f"found: {_type(s)}")
        return parse_date(s, fmt, tz)
    except CommandError:
        if "onError" in a:
            return ev(a["onError"])
        raise


_UNITS = {"millisecond": datetime.timedelta(milliseconds=1),
          "second": datetime.timedelta(seconds=1), "minute": datetime.timedelta(minutes=1),
          "hour": datetime.timedelta(hours=1), "day": datetime.timedelta(days=1),
          "week": datetime.timedelta(weeks=1)}
_MONTHS = {"month": 1, "quarter": 3, "year": 12}


def _unit(u) -> str:
    if u not in _UNITS and u not in _MONTHS:
        raise _err(f"unknown time unit value: {u!r:.40}", 9)
    return u


def _add_months(d: datetime.datetime, n: int) -> datetime.datetime:
    y, m = divmod(d.month - 1 + n, 12)
    year = d.year + y
    day = min(d.day, calendar.monthrange(year, m + 1)[1])
    return d.replace(year=year, month=m + 1, day=day)


def _date_add(x, ev, name="$dateAdd"):
    a = _fields(name, x, ("startDate", "unit", "amount"), ("timezone",))
    d, unit, n = ev(a["startDate"]), ev(a["unit"]), ev(a["amount"])
    if _null(d) or _null(unit) or _null(n):
        return None
    if not isinstance(d, datetime.datetime):
        raise _err(f"{name} requires startDate to be a date, not {_type(d)}", 5166403)
    n = _int_arg(n, name, "amount") * (-1 if name == "$dateSubtract" else 1)
    unit = _unit(unit)
    tz = _zone(ev(a["timezone"])) if "timezone" in a else None
    if unit in _UNITS and unit not in ("day", "week"):  # a fixed length: in UTC
        return d + n * _UNITS[unit]
    # days and longer on the timezone's wall clock (the hour kept across a
    # daylight saving change), as MongoDB's
    local = _local(d, tz)
    if unit in _UNITS:
        return _utc(local + n * _UNITS[unit], tz)
    return _utc(_add_months(local, n * _MONTHS[unit]), tz)


_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_REFERENCE = datetime.datetime(2000, 1, 1)  # $dateTrunc's bins start there, as MongoDB's


def _start_of_week(a: dict, ev, name: str) -> int | None:
    """``startOfWeek`` as a weekday (Monday 0, as Python's; Sunday when it is
    not given); None when it is given as null. A day's name or its first
    three letters, any case, as MongoDB."""
    if "startOfWeek" not in a:
        return 6
    v = ev(a["startOfWeek"])
    if _null(v):
        return None
    day = v.lower() if isinstance(v, str) else None
    for i, d in enumerate(_DAYS):
        if day in (d, d[:3]):
            return i
    raise _err(f"{name} parameter 'startOfWeek' must be a day of the week, not {v!r:.40}",
               5439015)


def _week_start(d: datetime.datetime, sow: int) -> datetime.datetime:
    """The midnight that starts ``d``'s week, weeks starting on weekday ``sow``."""
    day = d.replace(hour=0, minute=0, second=0, microsecond=0)
    return day - datetime.timedelta(days=(day.weekday() - sow) % 7)


def _date_diff(x, ev, name="$dateDiff"):
    """The unit's boundaries crossed from startDate to endDate, in the
    timezone (weeks start on startOfWeek), as MongoDB counts them."""
    a = _fields(name, x, ("startDate", "endDate", "unit"), ("timezone", "startOfWeek"))
    s, e, unit = ev(a["startDate"]), ev(a["endDate"]), ev(a["unit"])
    if _null(s) or _null(e) or _null(unit):
        return None
    if not isinstance(s, datetime.datetime) or not isinstance(e, datetime.datetime):
        raise _err(f"{name} requires startDate and endDate to be dates", 5166307)
    unit = _unit(unit)
    tz = _zone(ev(a["timezone"])) if "timezone" in a else None
    s, e = _local(s, tz), _local(e, tz)
    if unit == "year":
        return e.year - s.year
    if unit in _MONTHS:
        months = (e.year * 12 + e.month - 1) // _MONTHS[unit]
        return months - (s.year * 12 + s.month - 1) // _MONTHS[unit]
    if unit == "week":
        sow = _start_of_week(a, ev, name)
        if sow is None:
            return None
        return (_week_start(e, sow) - _week_start(s, sow)).days // 7
    size = _UNITS[unit]

    def floor(d):
        return EPOCH + ((d - EPOCH) // size) * size
    return (floor(e) - floor(s)) // size


def _date_trunc(x, ev, name="$dateTrunc"):
    """The start of the bin of ``binSize`` units that holds the date, bins
    counted from 2000-01-01 in the timezone (for weeks, from the first
    startOfWeek on or after it), as MongoDB."""
    a = _fields(name, x, ("date", "unit"), ("binSize", "timezone", "startOfWeek"))
    d, unit = ev(a["date"]), ev(a["unit"])
    if _null(d) or _null(unit):
        return None
    if not isinstance(d, datetime.datetime):
        raise _err(f"{name} requires 'date' to be a date, not {_type(d)}", 5439012)
    unit = _unit(unit)
    bins = _int_arg(ev(a["binSize"]), name, "binSize") if "binSize" in a else 1
    if bins < 1:
        raise _err(f"{name} requires 'binSize' to be greater than 0, but got value {bins}",
                   5439017)
    tz = _zone(ev(a["timezone"])) if "timezone" in a else None
    local = _local(d, tz)
    if unit in _MONTHS:
        months = (local.year - 2000) * 12 + local.month - 1
        months -= months % (_MONTHS[unit] * bins)
        out = _add_months(_REFERENCE, months)
    elif unit == "week":
        sow = _start_of_week(a, ev, name)
        if sow is None:
            return None
        ref = _REFERENCE + datetime.timedelta(days=(sow - _REFERENCE.weekday()) % 7)
        weeks = (_week_start(local, sow) - ref).days // 7
        out = ref + datetime.timedelta(weeks=weeks - weeks % bins)
    elif unit == "day":
        size = _UNITS[unit] * bins
        out = _REFERENCE + ((local - _REFERENCE) // size) * size
    else:  # hours and shorter: fixed lengths from 2000-01-01 in the zone, counted in UTC
        ref, size = _utc(_REFERENCE, tz), _UNITS[unit] * bins
        return ref + ((d - ref) // size) * size
    return _utc(out, tz)


_CALENDAR = ("year", "month", "day", "hour", "minute", "second", "millisecond")
_ISO = ("isoWeekYear", "isoWeek", "isoDayOfWeek", "hour", "minute", "second", "millisecond")


def _date_to_parts(x, ev, name="$dateToParts"):
    a = _fields(name, x, ("date",), ("timezone", "iso8601"))
    local, _ = _date_arg({k: a[k] for k in ("date", "timezone") if k in a}, ev, name)
    if local is None:
        return None
    time = {"hour": local.hour, "minute": local.minute, "second": local.second,
            "millisecond": local.microsecond // 1000}
    if ev(a["iso8601"]) if "iso8601" in a else False:
        y, w, wd = local.isocalendar()
        return {"isoWeekYear": y, "isoWeek": w, "isoDayOfWeek": wd, **time}
    return {"year": local.year, "month": local.month, "day": local.day, **time}


def _date_from_parts(x, ev, name="$dateFromParts"):
    """A date from its parts; each part may overflow into the next, as in
    MongoDB (``month: 14`` is February of the next year)."""
    iso = isinstance(x, dict) and "isoWeekYear" in x
    names = _ISO if iso else _CALENDAR
    a = _fields(name, x, names[:1], names[1:] + ("timezone",))
    parts = {}
    for k in names:
        v = ev(a[k]) if k in a else (1 if k in ("month", "day", "isoWeek", "isoDayOfWeek")
                                     else 0)
        if _null(v):
            return None
        parts[k] = _int_arg(v, name, k)
    tz = _zone(ev(a["timezone"])) if "timezone" in a else None
    clock = datetime.timedelta(hours=parts["hour"], minutes=parts["minute"],
                               seconds=parts["second"], milliseconds=parts["millisecond"])
    try:
        if iso:
            base = datetime.datetime.fromisocalendar(parts["isoWeekYear"], 1, 1)
            day = base + datetime.timedelta(weeks=parts["isoWeek"] - 1,
                                            days=parts["isoDayOfWeek"] - 1)
        else:
            day = _add_months(datetime.datetime(parts["year"], 1, 1), parts["month"] - 1) \
                + datetime.timedelta(days=parts["day"] - 1)
    except (ValueError, OverflowError):
        raise _err(f"{name}: the year must be from 1 to 9999", 40523) from None
    return _utc(day + clock, tz)


OPS: dict[str, Callable[[Any, Callable], Any]] = {}
for _name, _fn in {
    "$dateToParts": _date_to_parts, "$dateFromParts": _date_from_parts,
    **{p: _date_part for p in _PARTS},
    "$dateToString": _date_to_string, "$dateFromString": _date_from_string,
    "$dateAdd": _date_add, "$dateSubtract": _date_add, "$dateDiff": _date_diff,
    "$dateTrunc": _date_trunc,
}.items():
    OPS[_name] = _named(_fn, _name)
