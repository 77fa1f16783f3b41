"""Shard records as formats/FORMAT.md defines them, for the tests' Python
scripts that craft shard sets pack_tool would refuse to write.

    import sys; sys.path.insert(0, "<repo>/tests/support"); from nl_record import crc32c, record
"""
import struct

_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data, crc=0):
    """CRC32C (Castagnoli) continuing from crc: crc32c(b"123456789") == 0xE3069283."""
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def record(payload, enc=2, label=0, w=48, h=40, length=None, magic=b"NLRC", version=1, channels=3):
    """A record: the 32-byte header (its fields as given, both CRCs valid) and the payload.
    length defaults to the payload's; enc is 0 raw, 1 PNG, 2 JPEG."""
    length = len(payload) if length is None else length
    head = struct.pack("<4sHBBIIIII", magic, version, enc, channels, label, w, h, length, crc32c(payload))
    return head + struct.pack("<I", crc32c(head)) + payload


assert crc32c(b"123456789") == 0xE3069283
