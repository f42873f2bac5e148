"""Reader for the IDX format used by MNIST, Fashion-MNIST and EMNIST.

An IDX file is a 4-byte magic number ``00 00 TT DD`` (``TT`` a dtype code, ``DD`` the
number of dimensions), ``DD`` big-endian uint32 sizes, then the data, big-endian, row major.
Files are often gzipped; we detect that from the gzip magic bytes rather than the file
name, because mirrors rename files (``.gz`` stripped or added) inconsistently.
"""

from __future__ import annotations

import gzip
import os

import numpy as np

__all__ = ["read_idx", "parse_idx", "IDX_DTYPES"]

# dtype code -> big-endian numpy dtype (the IDX spec from Yann LeCun's MNIST page).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_GZIP_MAGIC = b"\x1f\x8b"


def parse_idx(raw: bytes, source: str = "<bytes>") -> np.ndarray:
    """Decode the (already decompressed) bytes of an IDX file.

    ``source`` only names the data in error messages.

    Example:
        >>> import numpy as np
        >>> raw = bytes([0, 0, 0x08, 1]) + (3).to_bytes(4, "big") + bytes([7, 8, 9])
        >>> parse_idx(raw)
        array([7, 8, 9], dtype=uint8)
    """
    if len(raw) < 4:
        raise ValueError(f"{source}: not an IDX file: only {len(raw)} bytes, need a 4-byte magic number")
    if raw[0] != 0 or raw[1] != 0:
        raise ValueError(
            f"{source}: not an IDX file: magic number {raw[:4].hex()} does not start with 0000"
        )
    code, ndim = raw[2], raw[3]
    if code not in IDX_DTYPES:
        known = ", ".join(f"0x{c:02X}" for c in IDX_DTYPES)
        raise ValueError(f"{source}: unknown IDX dtype code 0x{code:02X} (known: {known})")
    if ndim == 0:
        raise ValueError(f"{source}: IDX header declares 0 dimensions")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise ValueError(
            f"{source}: truncated IDX header: {ndim} dimensions need {header_len} bytes, file has {len(raw)}"
        )
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    dtype = IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = len(raw) - header_len
    if actual != expected:
        raise ValueError(
            f"{source}: IDX size mismatch: header shape {shape} of {dtype.name} needs {expected} data bytes, "
            f"file has {actual}"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header_len, count=expected // dtype.itemsize)
    # Native byte order so downstream arithmetic and device transfer need no byte swapping;
    # astype also copies out of the (immutable) bytes buffer.
    return data.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file, gzipped or raw, into a native-endian numpy array.

    Raises ``ValueError`` naming the file when the magic number, dtype code or size is wrong.

    Example:
        >>> images = read_idx("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")  # doctest: +SKIP
        >>> images.shape, images.dtype  # doctest: +SKIP
        ((10000, 28, 28), dtype('uint8'))
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise ValueError(f"{path}: corrupt gzip stream: {e}") from e
    return parse_idx(raw, source=path)
