#!/usr/bin/env python3
"""A reader of the pprof format (profile.proto, optionally gzipped), for
coralloc's profile tests and `coralloc profile`'s checks: no dependency, no
network. Decodes the Profile message into plain Python structures.

Usage as a program: read_pprof.py FILE prints the per-function totals
(leaf frames) for each sample type, one line each.
"""

from __future__ import annotations

import gzip
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Tuple


def _varint(buf: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[Tuple[int, int, object]]:
    """(field number, wire type, value: int or bytes) of each field."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(buf, pos)
            yield number, wire, buf[pos:pos + length]
            pos += length
        elif wire == 1:
            yield number, wire, int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wire == 5:
            yield number, wire, int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"wire type {wire} at byte {pos}")


def _packed(value: object) -> List[int]:
    if isinstance(value, int):
        return [value]
    assert isinstance(value, bytes)
    out, pos = [], 0
    while pos < len(value):
        v, pos = _varint(value, pos)
        out.append(v)
    return out


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


@dataclass
class Mapping:
    id: int = 0
    start: int = 0
    limit: int = 0
    offset: int = 0
    filename: str = ""
    build_id: str = ""
    has_functions: bool = False


@dataclass
class Location:
    id: int = 0
    mapping_id: int = 0
    address: int = 0
    function_ids: List[int] = field(default_factory=list)


@dataclass
class Sample:
    location_ids: List[int] = field(default_factory=list)
    values: List[int] = field(default_factory=list)


@dataclass
class Profile:
    sample_types: List[Tuple[str, str]] = field(default_factory=list)
    samples: List[Sample] = field(default_factory=list)
    mappings: Dict[int, Mapping] = field(default_factory=dict)
    locations: Dict[int, Location] = field(default_factory=dict)
    functions: Dict[int, str] = field(default_factory=dict)
    period_type: Tuple[str, str] = ("", "")
    period: int = 0
    default_sample_type: str = ""

    def frames(self, sample: Sample) -> List[str]:
        """Function names of a sample's stack, innermost first ('?' unknown)."""
        names = []
        for lid in sample.location_ids:
            loc = self.locations[lid]
            names.append(self.functions[loc.function_ids[0]] if loc.function_ids else "?")
        return names

    def totals_by(self, type_name: str, pick) -> Dict[str, int]:
        """Sum of one sample type by pick(frames) (a name or None: left out)."""
        k = [t for t, _ in self.sample_types].index(type_name)
        out: Dict[str, int] = {}
        for s in self.samples:
            key = pick(self.frames(s))
            if key is not None:
                out[key] = out.get(key, 0) + s.values[k]
        return out


def parse(data: bytes) -> Profile:
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    strings: List[str] = []
    raw_types: List[Tuple[int, int]] = []
    raw_period_type = (0, 0)
    raw_default = 0
    raw_funcs: Dict[int, int] = {}
    raw_maps: List[Tuple[Mapping, int, int]] = []
    prof = Profile()

    def value_type(buf: bytes) -> Tuple[int, int]:
        d = {n: v for n, _, v in _fields(buf)}
        return int(d.get(1, 0)), int(d.get(2, 0))

    for number, _, value in _fields(data):
        if number == 1:
            raw_types.append(value_type(value))
        elif number == 2:
            s = Sample()
            for n, _, v in _fields(value):
                if n == 1:
                    s.location_ids += _packed(v)
                elif n == 2:
                    s.values += [_signed(x) for x in _packed(v)]
            prof.samples.append(s)
        elif number == 3:
            m, fname, bid = Mapping(), 0, 0
            for n, _, v in _fields(value):
                if n == 1: m.id = v
                elif n == 2: m.start = v
                elif n == 3: m.limit = v
                elif n == 4: m.offset = v
                elif n == 5: fname = v
                elif n == 6: bid = v
                elif n == 7: m.has_functions = bool(v)
            raw_maps.append((m, fname, bid))
        elif number == 4:
            loc = Location()
            for n, _, v in _fields(value):
                if n == 1: loc.id = v
                elif n == 2: loc.mapping_id = v
                elif n == 3: loc.address = v
                elif n == 4:
                    line = {ln: lv for ln, _, lv in _fields(v)}
                    loc.function_ids.append(int(line.get(1, 0)))
            prof.locations[loc.id] = loc
        elif number == 5:
            d = {n: v for n, _, v in _fields(value)}
            raw_funcs[int(d.get(1, 0))] = int(d.get(2, 0))
        elif number == 6:
            strings.append(value.decode("utf-8", "replace"))
        elif number == 11:
            raw_period_type = value_type(value)
        elif number == 12:
            prof.period = value
        elif number == 14:
            raw_default = value
    prof.sample_types = [(strings[t], strings[u]) for t, u in raw_types]
    prof.period_type = (strings[raw_period_type[0]], strings[raw_period_type[1]])
    prof.default_sample_type = strings[raw_default]
    prof.functions = {fid: strings[name] for fid, name in raw_funcs.items()}
    for m, fname, bid in raw_maps:
        m.filename, m.build_id = strings[fname], strings[bid]
        prof.mappings[m.id] = m
    for loc in prof.locations.values():
        if loc.mapping_id and loc.mapping_id not in prof.mappings:
            raise ValueError(f"location {loc.id} names mapping {loc.mapping_id}, not in the file")
    for s in prof.samples:
        if len(s.values) != len(prof.sample_types):
            raise ValueError("a sample's values do not match the sample types")
    return prof


def read(path: str) -> Profile:
    with open(path, "rb") as f:
        return parse(f.read())


def main() -> int:
    prof = read(sys.argv[1])
    for t, unit in prof.sample_types:
        top = prof.totals_by(t, lambda fr: fr[0] if fr else "?")
        best = sorted(top.items(), key=lambda kv: -kv[1])[:5]
        print(f"{t} ({unit}): " + ", ".join(f"{k}={v}" for k, v in best))
    return 0


if __name__ == "__main__":
    sys.exit(main())
