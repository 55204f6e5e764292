"""numeric: exact Decimal in Python; decimal128/256(p,s) for constrained columns, exact text otherwise."""

from __future__ import annotations

import re
import struct
from decimal import Decimal

import numpy as np
import pyarrow as pa

from airflow_provider_pglogical.decoding.values.codec import MALFORMED, Codec, Notes
from airflow_provider_pglogical.decoding.values.vector import KIND_BINARY, KIND_TEXT, Column, validity_buffer
from airflow_provider_pglogical.exceptions import DecodeError

_HEAD = struct.Struct("!hhHh")  # ndigits, weight, sign, dscale; then ndigits x int16 base-10000 digits
_POS, _NEG, _NAN, _PINF, _NINF = 0x0000, 0x4000, 0xC000, 0xD000, 0xF000
_SPECIAL_TEXT = {_NAN: "NaN", _PINF: "Infinity", _NINF: "-Infinity"}
_NBASE = 10000
_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?")
VARHDRSZ = 4


# digit-array formats by ndigits (a numeric has at most NUMERIC_MAX_PRECISION/4 + 2 ≈ 40k digits)
_DIGIT_STRUCTS = {n: struct.Struct(f"!{n}h") for n in range(64)}
_POW10 = [10**e for e in range(64)]


def _digits(n: int) -> struct.Struct:
    return _DIGIT_STRUCTS.get(n) or struct.Struct(f"!{n}h")


def numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of numeric(p,s); None when unconstrained. Scale is 11-bit signed (15+)."""
    if typmod < VARHDRSZ:
        return None
    tm = typmod - VARHDRSZ
    return (tm >> 16) & 0xFFFF, ((tm & 0x7FF) ^ 1024) - 1024


def _head(raw: bytes) -> tuple[int, int, int, int, tuple[int, ...]]:
    if len(raw) < 8:
        raise DecodeError("truncated numeric binary value")
    ndigits, weight, sign, dscale = _HEAD.unpack_from(raw)
    if ndigits < 0 or len(raw) != 8 + 2 * ndigits:
        raise DecodeError("numeric binary length does not match its digit count")
    if sign not in (_POS, _NEG, _NAN, _PINF, _NINF) or dscale < 0:
        raise DecodeError("invalid numeric binary header")
    digits = _digits(ndigits).unpack_from(raw, 8)
    if digits and (min(digits) < 0 or max(digits) >= _NBASE):
        raise DecodeError("numeric digit out of range")
    return ndigits, weight, sign, dscale, digits


def numeric_text(raw: bytes) -> str:
    """numeric_out's exact text of a binary numeric, built from the digits (no int↔str limits)."""
    ndigits, weight, sign, dscale, digits = _head(raw)
    if sign in _SPECIAL_TEXT:
        return _SPECIAL_TEXT[sign]
    s = "".join(f"{d:04d}" for d in digits)
    point = 4 * (weight + 1)  # position of the decimal point within s
    if point < 0:
        s, point = "0" * -point + s, 0
    if len(s) < point:
        s += "0" * (point - len(s))
    whole, frac = s[:point].lstrip("0") or "0", s[point:]
    if len(frac) > dscale:
        if frac[dscale:].strip("0"):
            raise DecodeError("numeric digits beyond its display scale")
        frac = frac[:dscale]
    frac += "0" * (dscale - len(frac))
    text = f"{whole}.{frac}" if dscale else whole
    return "-" + text if sign == _NEG else text


def _unscaled(raw: bytes, scale: int) -> int | str:
    """The value times 10^scale as an int, or the special's text ('NaN', 'Infinity', '-Infinity')."""
    ndigits, weight, sign, dscale, digits = _head(raw)
    if sign in _SPECIAL_TEXT:
        return _SPECIAL_TEXT[sign]
    n = 0
    for d in digits:
        n = n * _NBASE + d
    e = 4 * (weight - ndigits + 1) + scale
    # int ** int is typed Any (a negative exponent gives a float); e and -e are >= 0 here
    if e >= 0:
        factor: int = 10**e
        n *= factor
    else:
        divisor: int = 10**-e
        n, rem = divmod(n, divisor)
        if rem:
            raise DecodeError("numeric scale exceeds the column's scale")
    return -n if sign == _NEG else n


def _text_unscaled(text: str, scale: int) -> int | str:
    if text in ("NaN", "Infinity", "-Infinity"):
        return text
    if not _TEXT.fullmatch(text):
        raise DecodeError("invalid numeric text value")
    whole, _, frac = text.lstrip("-").partition(".")
    if frac[scale:].strip("0"):
        raise DecodeError("numeric scale exceeds the column's scale")
    n = int(whole + frac[:scale].ljust(scale, "0"))
    return -n if text.startswith("-") else n


class NumericCodec(Codec):
    """Unconstrained numeric (or a typmod Arrow decimals cannot hold): Arrow string of numeric_out's text."""

    name, arrow_type = "numeric", pa.string()

    def from_binary(self, raw: bytes) -> Decimal:
        return Decimal(numeric_text(raw))

    def from_text(self, text: str) -> Decimal:
        if text not in ("NaN", "Infinity", "-Infinity") and not _TEXT.fullmatch(text):
            raise DecodeError("invalid numeric text value")
        return Decimal(text)

    # str here; DecimalCodec (a subclass) narrows these to Decimal | None
    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> str | Decimal | None:
        return numeric_text(raw)

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> str | Decimal | None:
        self.from_text(text)  # validate only: the server's text is already exact
        return text


class DecimalCodec(NumericCodec):
    """numeric(p,s) → decimal128(p,s) (decimal256 above p=38). NaN, the one special value a
    constrained column can hold, becomes a null field plus the note "NaN" at its path."""

    def __init__(self, precision: int, scale: int) -> None:
        self.precision, self.scale = precision, scale
        self.width = 16 if precision <= 38 else 32
        self.arrow_type = pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
        self.limit = 10**precision

    def _arrow(self, n: int | str, notes: Notes, path: str) -> Decimal | None:
        if isinstance(n, str):
            notes[path] = n
            return None
        if not -self.limit < n < self.limit:
            raise DecodeError("numeric value exceeds the column's precision")
        # from a string: Decimal arithmetic would round to the context's 28 digits
        return Decimal(f"{n}E-{self.scale}")

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> Decimal | None:
        return self._arrow(_unscaled(raw, self.scale), notes, path)

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> Decimal | None:
        return self._arrow(_text_unscaled(text, self.scale), notes, path)

    def column_with_notes(self, col: Column) -> tuple[pa.Array, dict[int, str]]:
        """Build the decimal buffer directly from unscaled ints; returns row index → note for specials.

        numeric(p ≤ 18) columns take the numpy path; the loop below is ``_unscaled`` inlined for
        the rest (and for specials/malformed values, which it reports precisely).
        """
        if self.precision <= 18 and not col.has(KIND_TEXT):
            fast = _int64_decimals(col, self.scale, self.limit)
            if fast is not None:
                return pa.Array.from_buffers(self.arrow_type, len(col), [fast[1], pa.py_buffer(fast[0])],
                                             null_count=fast[2]), {}
        kinds, raws = col.kinds_str(), col.raws()
        width, limit, scale = self.width, self.limit, self.scale
        zero = bytes(width)
        chunks: list[bytes] = []
        append = chunks.append
        nulls: list[int] = []
        specials: dict[int, str] = {}
        head, structs, pow10 = _HEAD.unpack_from, _DIGIT_STRUCTS, _POW10
        for i, (k, raw) in enumerate(zip(kinds, raws, strict=True)):
            if raw is None:
                append(zero)
                nulls.append(i)
                continue
            try:
                if k == "b":
                    ndigits, weight, sign, _dscale = head(raw)
                    if (sign != _POS and sign != _NEG) or len(raw) != 8 + 2 * ndigits:
                        n = _unscaled(raw, scale)  # specials and malformed values take the checked path
                    else:
                        n = 0
                        for d in structs[ndigits].unpack_from(raw, 8):
                            if not 0 <= d < _NBASE:
                                raise DecodeError("numeric digit out of range")
                            n = n * _NBASE + d
                        e = 4 * (weight - ndigits + 1) + scale
                        if e >= 0:
                            n *= pow10[e] if e < 64 else 10**e
                        else:
                            n, rem = divmod(n, 10**-e)
                            if rem:
                                raise DecodeError("numeric scale exceeds the column's scale")
                        if sign == _NEG:
                            n = -n
                else:
                    n = _text_unscaled(raw.decode("utf-8"), scale)
            except DecodeError:
                raise
            except MALFORMED:
                raise DecodeError("invalid numeric value") from None
            if isinstance(n, str):
                specials[i] = n
                nulls.append(i)
                append(zero)
                continue
            if not -limit < n < limit:
                raise DecodeError("numeric value exceeds the column's precision")
            append(n.to_bytes(width, "little", signed=True))
        count = len(raws)
        validity = None
        if nulls:
            valid = np.ones(count, dtype=bool)
            valid[nulls] = False
            validity = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
        arr = pa.Array.from_buffers(self.arrow_type, count, [validity, pa.py_buffer(b"".join(chunks))],
                                    null_count=len(nulls))
        return arr, specials


def _int64_decimals(col: Column, scale: int, limit: int) -> tuple[bytes, pa.Buffer | None, int] | None:
    """Vectorised numeric(p≤18, s): values grouped by byte length, digits combined in int64 with numpy.

    Returns (decimal128 data bytes, validity, null count), or None for anything unusual (specials,
    long digit arrays, malformed values) so the per-value loop handles it and raises precisely.
    """
    count = len(col)
    valid = col.kinds == KIND_BINARY
    lens = col.lengths
    unscaled = np.zeros(count, dtype=np.int64)
    for size in np.unique(lens[valid]).tolist():
        ndigits = (size - 8) // 2
        if size < 8 or size % 2 or ndigits > 5:
            return None
        rows = np.flatnonzero(valid & (lens == size))
        block = col.buf[col.starts[rows][:, None] + np.arange(size)].view(">i2").astype(np.int64)
        weight, sign = block[:, 1], block[:, 2] & 0xFFFF
        if (block[:, 0] != ndigits).any() or ((sign != _POS) & (sign != _NEG)).any():
            return None
        digits = block[:, 4:]
        if ((digits < 0) | (digits >= _NBASE)).any():
            return None
        n = np.zeros(len(rows), dtype=np.int64)
        for j in range(ndigits):  # ≤ 5 base-10000 digits: < 10^20 would overflow, so re-check below
            n = n * _NBASE + digits[:, j]
        e = 4 * (weight - ndigits + 1) + scale
        if ndigits == 5 or (e > 18).any() or (e < -20).any():
            return None
        up, down = np.where(e > 0, e, 0), np.where(e < 0, -e, 0)
        p_up, p_down = np.power(10, up, dtype=np.int64), np.power(10, down, dtype=np.int64)
        if (down > 18).any() or (n % p_down != 0).any():
            return None
        n = n // p_down
        if (np.abs(n) >= limit // np.maximum(p_up, 1) + 1).any():
            return None  # would exceed the precision (or int64): the exact path raises
        n = n * p_up
        unscaled[rows] = np.where(sign == _NEG, -n, n)
    if (np.abs(unscaled) >= limit).any():
        return None
    pair = np.empty((count, 2), dtype="<i8")  # decimal128: little-endian low word, then sign-extended high word
    pair[:, 0] = unscaled
    pair[:, 1] = unscaled >> 63
    nulls = int(count - valid.sum())
    return pair.tobytes(), validity_buffer(valid), nulls


def numeric_codec(typmod: int) -> NumericCodec:
    pm = numeric_typmod(typmod)
    # Arrow decimals need 1 <= p <= 76 and 0 <= s <= p (PG 15+ also allows s < 0 or s > p)
    if pm is None or not (1 <= pm[0] <= 76 and 0 <= pm[1] <= pm[0]):
        return NumericCodec()
    return DecimalCodec(*pm)
