"""R serialisation (XDR) and lazy-load databases, read in pure Python.

:func:`read_r_lazyload` reads an R lazy-load database (``Rdata.rdx`` + ``Rdata.rdb``, as data packages ship them);
:func:`r_unserialize` is a small reader of R's XDR serialisation covering the types data packages use (vectors,
lists, pairlists, symbols).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

_R_NILVALUE, _R_REF, _R_ENV, _R_SYM, _R_CHAR, _R_STR, _R_VEC, _R_EXPR = 254, 255, 4, 1, 9, 16, 19, 20
_R_PAIRLISTS = {2, 3, 5, 6, 17, 239, 240}  # LISTSXP CLOSXP PROMSXP LANGSXP DOTSXP ATTRLISTSXP ATTRLANGSXP
_R_SPECIAL = {253: "<globalenv>", 252: "<unbound>", 251: "<missing>", 250: "<basenamespace>",
              242: "<emptyenv>", 241: "<baseenv>"}


class RList(list):
    """An R generic vector; ``names`` holds its ``names`` attribute (or ``None``)."""

    names: list | None = None

    def as_dict(self) -> dict:
        if self.names is None:
            raise ValueError("R list has no names")
        return dict(zip(self.names, self))


class _RReader:
    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []

    def _int(self) -> int:
        (v,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return v

    def _len(self) -> int:
        n = self._int()
        if n == -1:
            hi, lo = self._int(), self._int()
            n = (hi << 32) + lo
        return n

    def _take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        if len(out) != n:
            raise ValueError("R serialisation: unexpected end of data")
        self.pos += n
        return out

    def header(self) -> None:
        fmt = self._take(2)
        if fmt != b"X\n":
            raise ValueError(f"R serialisation: only the XDR format is supported, got {fmt!r}")
        version = self._int()
        self._int(), self._int()  # writer R version, minimal reader R version
        if version == 3:
            self._take(self._int())  # native encoding name
        elif version != 2:
            raise ValueError(f"R serialisation: unsupported version {version}")

    def item(self):
        flags = self._int()
        t, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if t == _R_NILVALUE:
            return None
        if t in _R_SPECIAL:
            return _R_SPECIAL[t]
        if t == _R_REF:
            idx = flags >> 8 or self._int()
            return self.refs[idx - 1]
        if t == _R_SYM:
            sym = self.item()
            self.refs.append(sym)
            return sym
        if t == _R_ENV:
            env: dict = {}
            self.refs.append(env)
            self._int()  # locked
            self.item(), self.item(), self.item(), self.item()  # enclos, frame, hashtab, attrib
            return env
        if t in _R_PAIRLISTS:
            out: dict | list
            items, tags = [], []
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                items.append(self.item())
                tags.append(tag)
                nxt = self._int()
                t2 = nxt & 0xFF
                if t2 not in _R_PAIRLISTS:
                    self.pos -= 4
                    self.item()  # the terminating cdr (usually NILVALUE)
                    break
                has_attr, has_tag = bool(nxt & (1 << 9)), bool(nxt & (1 << 10))
            out = dict(zip(tags, items)) if all(tg is not None for tg in tags) else items
            return out
        if t == _R_CHAR:
            n = self._int()
            return None if n == -1 else self._take(n).decode("utf-8", errors="replace")
        if t in (10, 13):  # LGLSXP, INTSXP
            n = self._len()
            value = list(struct.unpack_from(f">{n}i", self._take(4 * n)))
        elif t == 14:  # REALSXP
            n = self._len()
            value = list(struct.unpack_from(f">{n}d", self._take(8 * n)))
        elif t == 24:  # RAWSXP
            value = self._take(self._len())
        elif t == _R_STR:
            value = [self.item() for _ in range(self._len())]
        elif t in (_R_VEC, _R_EXPR):
            value = RList(self.item() for _ in range(self._len()))
        else:
            raise ValueError(f"R serialisation: unsupported SEXP type {t}")
        if has_attr:
            attrs = self.item()
            if isinstance(value, RList) and isinstance(attrs, dict):
                value.names = attrs.get("names")
        return value


def r_unserialize(data: bytes):
    """Parse one R object serialised in XDR format (``serialize(x, NULL)``, ``saveRDS(compress=FALSE)``).

    Returns Python values: character vectors -> ``list[str | None]``, integer/logical -> ``list[int]``,
    double -> ``list[float]``, generic vectors -> :class:`RList`, tagged pairlists -> ``dict``.
    """
    reader = _RReader(data)
    reader.header()
    return reader.item()


def read_r_lazyload(rdx_path: str | Path) -> dict[str, object]:
    """Read every variable of an R lazy-load database (``X.rdx`` index next to ``X.rdb`` data).

    The ``.rdx`` is a compressed serialised list whose ``variables`` entry maps each name to ``(offset, length)``
    in the ``.rdb``; each ``.rdb`` record is a 4-byte big-endian uncompressed length followed by a zlib stream.
    """
    rdx_path = Path(rdx_path)
    raw = rdx_path.read_bytes()
    try:
        raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else zlib.decompress(raw[4:])
    except (zlib.error, gzip.BadGzipFile, EOFError) as e:
        raise ValueError(f"{rdx_path}: cannot read: corrupt compressed stream ({e})") from e
    index = r_unserialize(raw)
    if not isinstance(index, RList) or index.names is None or "variables" not in index.names:
        raise ValueError(f"{rdx_path}: not an R lazy-load index (no `variables` entry)")
    variables = index.as_dict()["variables"].as_dict()
    rdb = rdx_path.with_suffix(".rdb").read_bytes()
    out = {}
    for name, (offset, length) in sorted(variables.items()):
        record = rdb[offset:offset + length]
        (ulen,) = struct.unpack(">I", record[:4])
        try:
            payload = zlib.decompress(record[4:])
        except zlib.error as e:
            where = rdx_path.with_suffix(".rdb")
            raise ValueError(f"{where}: record {name}: cannot read: corrupt zlib stream ({e})") from e
        if len(payload) != ulen:
            raise ValueError(f"{rdx_path.with_suffix('.rdb')}: record {name} inflated to {len(payload)} != {ulen}")
        out[name] = r_unserialize(payload)
    return out
