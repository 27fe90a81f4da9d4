#!/usr/bin/env python3
"""Counts the pixels of a PNG screenshot close to given colours.

usage: png_colours.py SHOT.png RRGGBB [RRGGBB ...]
Prints one JSON object: {"width": W, "height": H, "counts": {"rrggbb": N, ...}}, where N counts the
pixels within a small distance of that colour (anti-aliased edges excluded). Decodes the PNG with
zlib only (8-bit RGB / RGBA, non-interlaced: what Chromium's --screenshot writes).
"""
import json
import struct
import sys
import zlib


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"{path}: not a PNG file")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
    width, height, depth, colour_type, _, _, interlace = header
    if depth != 8 or colour_type not in (2, 6) or interlace != 0:
        sys.exit(f"{path}: unsupported PNG (depth {depth}, colour type {colour_type}, interlace {interlace})")
    bpp = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def main():
    path, colours = sys.argv[1], [c.lower().lstrip("#") for c in sys.argv[2:]]
    width, height, bpp, rows = decode(path)
    targets = [(c, int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)) for c in colours]
    counts = {c: 0 for c in colours}
    for line in rows:
        for x in range(0, width * bpp, bpp):
            r, g, b = line[x], line[x + 1], line[x + 2]
            for name, tr, tg, tb in targets:
                if abs(r - tr) + abs(g - tg) + abs(b - tb) <= 24:
                    counts[name] += 1
    print(json.dumps({"width": width, "height": height, "counts": counts}))


main()
