"""Copying a job's checkpoint to another site's store, verified, and resumable where it stopped.

Files are streamed through fsspec (any URL scheme) with a SHA-256 computed on the way; every copy
is written beside its final name, read back and compared, and only then moved into place, so a
file under its final name is always a verified copy; when the checkpoint carries the training
runtime's manifest (`manifest.json` with a sha256 per file) the source must match it too. The
manifest is copied last, so a reader never mistakes a half-copied checkpoint for a complete one.

A copy resumed (`landed`: the files an earlier copy verified, with their checksums) copies only the
rest: the scheduler's mover keeps that list in the store, so a new leader does not copy again what
the last one landed (scheduler/mover.py).

Each end may be a store of its own (another site's S3 endpoint, with its credentials): its fsspec
storage options (`source_options`, `destination_options`; settings
`sites.<name>.checkpoint_store_options`) open it; without them, fsspec reads the environment.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
from botocore.exceptions import BotoCoreError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CHUNK = 4 << 20


# What a store's client raises when a store is unreachable or refuses: OSError, and botocore's own
# errors, which s3fs lets through (a connection refused, no credentials).
STORE_ERRORS = (OSError, BotoCoreError)


class TransferError(Exception):
    """The checkpoint could not be copied, or the copy does not match its source."""


class Corrupt(TransferError):
    """The source does not match its own manifest, or does not exist: copying again cannot help."""


@dataclass(frozen=True)
class Landed:
    """One file verified at the destination, and how far the copy is."""

    name: str  # its path relative to the checkpoint
    sha256: str
    bytes_done: int  # the checkpoint's bytes at the destination now, this file's included
    bytes_total: int


@dataclass(frozen=True)
class Copied:
    source: str
    destination: str
    files: int
    bytes: int
    copied_bytes: int  # of which this copy sent (the rest had landed before it)
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
    source: str,
    destination: str,
    *,
    landed: Mapping[str, str] | None = None,
    on_file: Callable[[Landed], None] | None = None,
    tag: str = "copy",
    source_options: Mapping[str, Any] | None = None,
    destination_options: Mapping[str, Any] | None = None,
) -> Copied:
    """Copy the checkpoint directory `source` to `destination` and verify every byte. The files of
    `landed` (path -> sha256) are not copied again where they lie at the destination; `on_file` hears
    of each file as it lands (an exception from it stops the copy). `tag` names the copier's part
    files: two copiers (a leader and a stale one) never write the same part file. `source_options`
    and `destination_options`: the fsspec storage options of each end's store."""
    try:
        src = fsspec.core.url_to_fs(source, **(source_options or {}))
        dst = fsspec.core.url_to_fs(destination, **(destination_options or {}))
        return _copy(source, destination, src, dst, dict(landed or {}), on_file, tag)
    except STORE_ERRORS as error:  # an unreadable source, an unwritable or unreachable destination
        raise TransferError(f"copying {source} to {destination}: {error}") from error


def _copy(
    source: str,
    destination: str,
    src: tuple[fsspec.AbstractFileSystem, str],
    dst: tuple[fsspec.AbstractFileSystem, str],
    landed: dict[str, str],
    on_file: Callable[[Landed], None] | None,
    tag: str,
) -> Copied:
    (src_fs, src_root), (dst_fs, dst_root) = src, dst
    src_root, dst_root = src_root.rstrip("/"), dst_root.rstrip("/")
    if not src_fs.isdir(src_root):
        raise Corrupt(f"checkpoint {source} does not exist")
    names = sorted(p[len(src_root) + 1 :] for p in src_fs.find(src_root))
    names = [n for n in names if n != MANIFEST] + ([MANIFEST] if MANIFEST in names else [])
    recorded = _expected(src_fs, src_root)
    sizes = {name: int(src_fs.size(f"{src_root}/{name}")) for name in names}
    total = sum(sizes.values())
    done = sent = 0
    fingerprint = hashlib.sha256()
    for name in names:
        dst_path = f"{dst_root}/{name}"
        digest = landed.get(name)
        if digest is None or not dst_fs.exists(dst_path):
            digest = _copy_file(src_fs, f"{src_root}/{name}", dst_fs, dst_path, tag)
            if name in recorded and recorded[name] != digest:
                dst_fs.rm(f"{dst_path}.part-{tag}")
                raise Corrupt(
                    f"{source}/{name}: sha256 {digest} does not match the manifest's {recorded[name]}"
                )
            dst_fs.mv(f"{dst_path}.part-{tag}", dst_path)
            sent += sizes[name]
            done += sizes[name]
            if on_file:
                on_file(Landed(name, digest, done, total))
        else:
            done += sizes[name]
        fingerprint.update(f"{name}\0{digest}\n".encode())
    log.info(
        "checkpoint %s -> %s: %d files, %d bytes verified (%d sent)",
        source,
        destination,
        len(names),
        done,
        sent,
    )
    return Copied(source, destination, len(names), done, sent, fingerprint.hexdigest())


def _copy_file(
    src_fs: fsspec.AbstractFileSystem, src: str, dst_fs: fsspec.AbstractFileSystem, dst: str, tag: str
) -> str:
    """Stream `src` to a part file beside `dst` and read it back: its sha256 once the two agree (the
    caller moves it into place)."""
    sha = hashlib.sha256()
    part = f"{dst}.part-{tag}"
    dst_fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
    with src_fs.open(src, "rb") as reader, dst_fs.open(part, "wb") as writer:
        while chunk := reader.read(CHUNK):
            sha.update(chunk)
            writer.write(chunk)
    digest = sha.hexdigest()
    if _digest(dst_fs, part)[0] != digest:
        raise TransferError(f"{dst}: the copy does not match its source")
    return digest
