"""Moving a job's newest checkpoint to another site's store, verified before the attempt starts.

Files are streamed through fsspec (any URL scheme) with a SHA-256 computed on the way; every copy
is read back and compared, and when the checkpoint carries the training runtime's manifest
(`manifest.json` with a sha256 per file) the source must match it too. The manifest is copied
last, so a reader never mistakes a half-copied checkpoint for a complete one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import fsspec

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CHUNK = 4 << 20


class TransferError(Exception):
    """The checkpoint could not be copied, or the copy does not match its source."""


@dataclass(frozen=True)
class Transfer:
    source: str
    destination: str
    files: int
    bytes: int
    sha256: str  # of the sorted (path, file sha256) list: one fingerprint of the whole checkpoint


def _digest(fs: fsspec.AbstractFileSystem, path: str) -> tuple[str, int]:
    sha, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), size


def _expected(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, str]:
    """Checksums the training runtime recorded in the manifest, by path relative to the checkpoint."""
    path = f"{root}/{MANIFEST}"
    if not fs.exists(path):
        return {}
    with fs.open(path, "r") as handle:
        manifest = json.load(handle)
    return {
        name: str(entry["sha256"]) for name, entry in manifest.get("files", {}).items() if "sha256" in entry
    }


def copy_checkpoint(
    source: str, destination: str, *, progress: Callable[[int, int], None] | None = None
) -> Transfer:
    """Copy the checkpoint directory `source` to `destination` and verify every byte."""
    try:
        return _copy(source, destination, progress)
    except OSError as error:  # an unreadable source, an unwritable or unreachable destination
        raise TransferError(f"copying {source} to {destination}: {error}") from error


def _copy(source: str, destination: str, progress: Callable[[int, int], None] | None) -> Transfer:
    src_fs, src_root = fsspec.core.url_to_fs(source)
    dst_fs, dst_root = fsspec.core.url_to_fs(destination)
    src_root, dst_root = src_root.rstrip("/"), dst_root.rstrip("/")
    if not src_fs.isdir(src_root):
        raise TransferError(f"checkpoint {source} does not exist")
    names = sorted(p[len(src_root) + 1 :] for p in src_fs.find(src_root))
    names = [n for n in names if n != MANIFEST] + ([MANIFEST] if MANIFEST in names else [])
    recorded = _expected(src_fs, src_root)
    total = sum(src_fs.size(f"{src_root}/{name}") for name in names)
    copied = 0
    fingerprint = hashlib.sha256()
    for name in names:
        sha = hashlib.sha256()
        dst_path = f"{dst_root}/{name}"
        dst_fs.makedirs(dst_path.rsplit("/", 1)[0], exist_ok=True)
        with src_fs.open(f"{src_root}/{name}", "rb") as reader, dst_fs.open(dst_path, "wb") as writer:
            while chunk := reader.read(CHUNK):
                sha.update(chunk)
                writer.write(chunk)
                copied += len(chunk)
                if progress:
                    progress(copied, total)
        digest = sha.hexdigest()
        if name in recorded and recorded[name] != digest:
            raise TransferError(
                f"{source}/{name}: sha256 {digest} does not match the manifest's {recorded[name]}"
            )
        if _digest(dst_fs, dst_path)[0] != digest:
            raise TransferError(f"{destination}/{name}: the copy does not match its source")
        fingerprint.update(f"{name}\0{digest}\n".encode())
    log.info("checkpoint %s -> %s: %d files, %d bytes verified", source, destination, len(names), copied)
    return Transfer(source, destination, len(names), copied, fingerprint.hexdigest())
