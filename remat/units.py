"""Units and plain-text formatting that planning and reporting share: byte and flop sizes in words, byte sizes
parsed from strings, op names shortened, rows of cells laid out as a table.

Planning (remat.plan) writes its decisions' reasons with these; remat.report lays out whole plans with them.
"""

from __future__ import annotations

import fractions
import math
import numbers
import re
from collections.abc import Sequence

KIB = 2**10
MIB = 2**20
GIB = 2**30

_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_UNIT_HELP = (
    "accepted units are B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024), "
    'case-insensitive, e.g. "512MiB", "2GB", "1.5 GiB" or "4096" (plain digits are bytes)'
)
_SIZE_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)")
_PER_SECOND_RE = re.compile(r"(.*?)\s*/\s*s", re.IGNORECASE)
_BANDWIDTH_FORMS = 'bytes per second > 0: an int or float (12e9) or a string such as "12GB/s", "12 GiB/s" or "12GB"'


def fmt_bytes(n: int) -> str:
    """Bytes in binary units with one decimal: "512 B", "4.0 KiB", "41.0 MiB", "2.5 GiB"."""
    if abs(n) < KIB:
        return f"{n} B"
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    raise AssertionError("unreachable")


def fmt_flops(n: float) -> str:
    """Flops with a decimal prefix and one decimal: "512 FLOP", "14.3 MFLOP", "1.2 GFLOP"."""
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("KFLOP", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} FLOP"


def short_op(op: str) -> str:
    """ "aten._softmax.default" → "softmax"; "getitem" stays."""
    parts = op.split(".")
    name = parts[1] if len(parts) == 3 else op
    return name.lstrip("_") or name


def render_table(rows: Sequence[Sequence[str]], right_align: bool = False) -> list[str]:
    """Rows of cells (the head first) as lines, columns two spaces apart and each as wide as its widest cell; the
    first column is left-aligned, the others left-aligned too or, with `right_align`, right-aligned. Lines carry no
    trailing spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def cell(i: int, text: str) -> str:
        return text.rjust(widths[i]) if right_align and i > 0 else text.ljust(widths[i])

    return ["  ".join(cell(i, c) for i, c in enumerate(row)).rstrip() for row in rows]


def parse_bytes(value: int | str, option: str = "memory_budget") -> int:
    """Return ``value`` as a whole number of bytes.

    ``value`` is an int >= 0 or a string: plain digits (bytes) or a number with a unit, ``"512MiB"``, ``"2GB"``,
    ``"1.5 GiB"``; units are B, KB/MB/GB/TB (powers of 1000) and KiB/MiB/GiB/TiB (powers of 1024), case-insensitive.
    Fractional values need a unit and are rounded down to whole bytes. ``option`` names the option in errors.
    """
    where = f"{option}={value!r}"
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, str)):
        raise TypeError(f'{where}: expected a number of bytes as an int or a string such as "1.5GiB"; {_UNIT_HELP}')
    if not isinstance(value, str):
        if value < 0:
            raise ValueError(f"{where}: a byte count must be >= 0")
        return int(value)
    return math.floor(_size(value, where))


def _size(value: str, where: str) -> fractions.Fraction:
    """The bytes a size string names, exactly; errors start with `where`."""
    match = _SIZE_RE.fullmatch(value.strip())
    if match is None:
        if value.strip().startswith("-"):
            raise ValueError(f"{where}: a byte count must be >= 0")
        raise ValueError(f"{where}: not a byte size; {_UNIT_HELP}")
    number, unit = match.groups()
    if not unit:
        if not number.isdigit():
            raise ValueError(f'{where}: a fractional size needs a unit, e.g. "{number}GiB"; {_UNIT_HELP}')
        return fractions.Fraction(int(number))
    if unit.lower() not in _UNITS:
        raise ValueError(f"{where}: unknown unit {unit!r}; {_UNIT_HELP}")
    # Fraction keeps "0.1GB" exact (float arithmetic could round it to 99999999 bytes).
    return fractions.Fraction(number) * _UNITS[unit.lower()]


def parse_bandwidth(value: int | float | str, option: str = "host_bandwidth") -> int:
    """Return ``value`` as whole bytes per second, >= 1.

    ``value`` is an int or a finite float (``12e9``), or a string: a byte size with a unit and an optional ``/s``,
    ``"12GB/s"``, ``"12 GiB/s"``, ``"12GB"`` (units as in ``parse_bytes``). ``option`` names the option in errors.
    """
    where = f"{option}={value!r}"
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise TypeError(f"{where}: expected {_BANDWIDTH_FORMS}")
    if isinstance(value, str):
        per_second = _PER_SECOND_RE.fullmatch(value.strip())
        text = per_second.group(1) if per_second else value
        try:
            rate = _size(text, where)
        except ValueError as exc:
            try:
                rate = fractions.Fraction(float(text))  # a plain number of bytes per second, "12e9"
            except (ValueError, OverflowError):
                raise ValueError(f'{exc}; a bandwidth may end in "/s", e.g. "12GB/s"') from None
    elif not math.isfinite(value):
        raise ValueError(f"{where}: expected {_BANDWIDTH_FORMS}")
    else:
        rate = fractions.Fraction(value)
    if rate <= 0:
        raise ValueError(f'{where}: bytes per second must be > 0, e.g. "12GB/s" or 12e9')
    if rate < 1:
        raise ValueError(f"{where}: less than one byte per second; expected {_BANDWIDTH_FORMS}")
    return math.floor(rate)
