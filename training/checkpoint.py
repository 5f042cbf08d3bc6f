"""Durable, resumable checkpoints with torch.distributed.checkpoint (DCP) through fsspec.

Layout under the checkpoint root (any fsspec URL):

    step-000000120-t42/   (t42: the fencing token of the attempt that wrote it; none outside gpuyard)
        state/            DCP files: model and optimizer, sharded by the ranks that saved them
        rng/rank-N.pt     each rank's RNG states
        trainer.pt        LR scheduler state, step, data position, metrics (rank 0)
        manifest.json     written LAST, after every other file is durable: sizes and sha256 of every file

A checkpoint without a manifest (or whose checksums do not match) is incomplete and never read. DCP stores
tensors by their fully qualified names, and (format 2) the optimizer's state and hyperparameters by the
name of their parameter too, so a checkpoint saved by N ranks loads on M ranks in any layout
(training/layouts.py: DDP, FSDP, TP, a pipeline's stages, each holding its own parameters' state).
Format 1, which nested the optimizer's state by parameter group, is still read.

Storage is fenced like the leases: each attempt writes only folders named with its own fencing token, and
its retention never touches a folder of a newer token. A zombie (an attempt whose lease passed, still
running somewhere) can therefore neither mix its files into its successor's step nor delete them. On a
local filesystem every file and folder is fsynced before the manifest, and the manifest before its rename.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import fsspec
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsspec.implementations.local import LocalFileSystem
from torch import nn
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT_VERSION = 2  # 2: the optimizer's state keyed by parameter name (flattened)
READABLE_VERSIONS = (1, 2)
_STEP_DIR = re.compile(r"step-(\d+)(?:-t(\d+))?$")
IO_TIMEOUT_S = 30.0


def storage_options(url: str, io_timeout_s: float = IO_TIMEOUT_S) -> dict[str, Any]:
    """What the filesystem of `url` is opened with. On an object store every request waits at most
    `io_timeout_s` for the server, then fails and is retried: botocore waits 60 s per try, so a request
    on a connection a network fault dropped held a save, or a rank's resume, for minutes of retries."""
    if url.split("://", 1)[0] in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": min(10.0, io_timeout_s), "read_timeout": io_timeout_s}}
    return {}


_OWN: Any = object()  # "this store's own token" as a default argument


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt."""


@dataclass(frozen=True)
class CheckpointRecord:
    """What a heartbeat reports about the newest durable checkpoint."""

    url: str
    step: int
    saved_at: datetime
    cost_s: float
    bytes: int | None = None  # all its files, by its manifest: what a move to another site copies

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "step": self.step,
            "saved_at": self.saved_at.isoformat(),
            "cost_s": round(self.cost_s, 6),
            "bytes": self.bytes,
        }


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    saved_at: str
    files: dict[str, dict[str, Any]]
    metrics: dict[str, float] = field(default_factory=dict)
    run: dict[str, str | None] = field(default_factory=dict)
    """mlflow_run_id, job_id, attempt_id: what ties attempts of one run together."""
    cost_s: float = 0.0
    format_version: int = FORMAT_VERSION
    writer_token: int | None = None
    """The fencing token of the attempt that wrote it (part of its folder's name)."""

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        if raw.get("format_version") not in READABLE_VERSIONS:
            got = raw.get("format_version")
            raise CheckpointError(f"manifest format_version: expected one of {READABLE_VERSIONS}, got {got}")
        return cls(**raw)

    @property
    def bytes(self) -> int:
        """Its files' size, all told (the manifest itself aside)."""
        return sum(int(entry.get("size", 0)) for entry in self.files.values())


def _state_options(version: int) -> StateDictOptions:
    """How a checkpoint of `version` lays out the optimizer: flattened by parameter name from 2 on, so
    ranks holding different parameters (a pipeline's stages) never write one key two ways."""
    return StateDictOptions(flatten_optimizer_state_dict=version >= 2)


def _fsync(fs: fsspec.AbstractFileSystem, paths: list[str]) -> None:
    """Make files (and folders: their entries) durable on a local filesystem; object stores are durable
    once a write returns."""
    if not isinstance(fs, LocalFileSystem):
        return
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _sha256(fs: fsspec.AbstractFileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class CheckpointStore:
    """The checkpoint root: lists complete checkpoints, writes manifests, applies retention.

    `token`: the fencing token of the attempt writing through this store (None outside gpuyard); it names
    the folders this store writes, and bounds what its retention may delete."""

    def __init__(self, url: str, token: int | None = None, io_timeout_s: float = IO_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.options = storage_options(self.url, io_timeout_s)  # DCP's readers and writers open it alike
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **self.options)

    def folder(self, step: int, token: int | None = _OWN) -> str:
        token = self.token if token is _OWN else token
        return f"step-{step:09d}" + (f"-t{token}" if token is not None else "")

    def step_url(self, step: int, token: int | None = _OWN) -> str:
        return f"{self.url}/{self.folder(step, token)}"

    def step_path(self, step: int, token: int | None = _OWN) -> str:
        """The step's folder as a path of `self.fs` (no protocol)."""
        return f"{self.root}/{self.folder(step, token)}"

    def entries(self) -> list[tuple[int, int | None]]:
        """(step, writer token) of every step folder, complete or not, oldest first."""
        if not self.fs.exists(self.root):
            return []
        found = []
        for entry in self.fs.ls(self.root, detail=False):
            m = _STEP_DIR.search(entry.rstrip("/"))
            if m:
                found.append((int(m.group(1)), int(m.group(2)) if m.group(2) else None))
        return sorted(found, key=lambda e: (e[0], -1 if e[1] is None else e[1]))

    def steps(self) -> list[int]:
        """Steps that have a folder, complete or not, oldest first."""
        return sorted({step for step, _ in self.entries()})

    def read_manifest(self, step: int, token: int | None = _OWN) -> Manifest | None:
        path = f"{self.step_path(step, token)}/{MANIFEST}"
        if not self.fs.exists(path):
            return None
        with self.fs.open(path, "r") as fh:
            return Manifest.from_json(fh.read())

    def complete(self) -> list[Manifest]:
        manifests = []
        for step, token in self.entries():
            try:
                m = self.read_manifest(step, token)
            except (CheckpointError, ValueError, TypeError) as exc:
                log.warning("checkpoint %s: unreadable manifest (%s), skipped", self.folder(step, token), exc)
                continue
            if m is not None:
                manifests.append(m)
        return manifests

    def _may_delete(self, token: int | None) -> bool:
        """A folder of this writer or of an older one: never a successor's (a newer token)."""
        return token is None or (self.token is not None and token <= self.token)

    def verify(self, manifest: Manifest, checksums: bool = True) -> str | None:
        """None when every file the manifest lists is there with its size (and sha256); else the reason."""
        base = self.step_path(manifest.step, manifest.writer_token)
        for rel, info in manifest.files.items():
            path = f"{base}/{rel}"
            if not self.fs.exists(path):
                return f"{rel} is missing"
            size = self.fs.size(path)
            if size != info["size"]:
                return f"{rel} has {size} bytes, manifest says {info['size']}"
        if checksums:
            actual = self.describe(manifest.step, list(manifest.files), manifest.writer_token)
            for rel, info in manifest.files.items():
                if actual[rel]["sha256"] != info["sha256"]:
                    return f"{rel} does not match its sha256"
        return None

    def latest(self, verify_checksums: bool = True) -> Manifest | None:
        """The newest checkpoint that is complete and intact."""
        for manifest in reversed(self.complete()):
            problem = self.verify(manifest, verify_checksums)
            if problem is None:
                return manifest
            log.warning("checkpoint step %d is damaged (%s); trying an older one", manifest.step, problem)
        return None

    def recorded(self, url: str | None, verify_checksums: bool = True) -> Manifest | None:
        """The checkpoint at `url` (the one the control plane recorded as the job's newest durable), if it
        is a complete, intact folder of this root; None otherwise."""
        if not url or url.rstrip("/").rsplit("/", 1)[0] != self.url:
            return None
        m = _STEP_DIR.search(url.rstrip("/"))
        if m is None:
            return None
        try:
            manifest = self.read_manifest(int(m.group(1)), int(m.group(2)) if m.group(2) else None)
        except (CheckpointError, ValueError, TypeError):
            return None
        if manifest is None or (problem := self.verify(manifest, verify_checksums)) is not None:
            log.warning(
                "recorded checkpoint %s is not usable (%s)",
                url,
                "no manifest" if manifest is None else problem,
            )
            return None
        return manifest

    def clear_incomplete(self, step: int) -> None:
        """Remove what an earlier, interrupted attempt left in the step's folder (no manifest), so the new
        save's manifest lists only its own files."""
        path = self.step_path(step)
        if self.fs.exists(path) and not self.fs.exists(f"{path}/{MANIFEST}"):
            self.fs.rm(path, recursive=True)

    def relative_files(self, step: int) -> list[str]:
        """This writer's files of the step's folder."""
        base = self.step_path(step)
        rels = []
        for path in sorted(self.fs.find(base)):
            rel = path[len(base) + 1 :] if path.startswith(base + "/") else path.rsplit("/step-", 1)[-1]
            if rel not in (MANIFEST, MANIFEST + ".tmp"):
                rels.append(rel)
        return rels

    def describe(self, step: int, rels: list[str], token: int | None = _OWN) -> dict[str, dict[str, Any]]:
        """Size and sha256 of some files of a step's folder (hashed in parallel threads)."""
        base = self.step_path(step, token)
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(4, len(rels)))) as pool:
            digests = list(pool.map(lambda rel: _sha256(self.fs, f"{base}/{rel}"), rels))
        return {
            rel: {"size": self.fs.size(f"{base}/{rel}"), "sha256": digest}
            for rel, digest in zip(rels, digests, strict=True)
        }

    def finalize(
        self,
        step: int,
        world_size: int,
        metrics: dict[str, float],
        run: dict[str, str | None],
        cost_s: float,
        known: dict[str, dict[str, Any]] | None = None,
    ) -> Manifest:
        """Checksum every file of the step's folder (but those in `known`, hashed by the ranks that wrote
        them), then write the manifest (atomically, last)."""
        base = self.step_path(step)
        known = known or {}
        rels = self.relative_files(step)
        files = {
            **self.describe(step, [r for r in rels if r not in known]),
            **{r: known[r] for r in rels if r in known},
        }
        files = dict(sorted(files.items()))
        manifest = Manifest(
            step=step,
            world_size=world_size,
            saved_at=datetime.now(UTC).isoformat(),
            files=files,
            metrics=metrics,
            run=run,
            cost_s=cost_s,
            writer_token=self.token,
        )
        folders = sorted({f"{base}/{rel}".rsplit("/", 1)[0] for rel in files} | {base})
        _fsync(self.fs, [f"{base}/{rel}" for rel in files] + folders)
        tmp = f"{base}/{MANIFEST}.tmp"
        self.fs.makedirs(base, exist_ok=True)
        with self.fs.open(tmp, "w") as fh:
            fh.write(json.dumps(asdict(manifest), indent=1, sort_keys=True))
        _fsync(self.fs, [tmp])
        self.fs.mv(tmp, f"{base}/{MANIFEST}")
        _fsync(self.fs, [base, self.root])
        return manifest

    def apply_retention(
        self,
        keep_last: int,
        best_metric: str | None,
        best_mode: str,
        newest: int,
        protected: tuple[int, int | None] | None = None,
    ) -> list[int]:
        """Delete complete checkpoints beyond the newest `keep_last`, the best by `best_metric` and
        `protected` (the one the control plane recorded), and abandoned incomplete ones older than
        `newest`, among this writer's folders and older writers' (never a newer token's: a successor's
        steps, complete or being written). Returns the steps deleted."""
        ours = [m for m in self.complete() if self._may_delete(m.writer_token)]
        keep = {(m.step, m.writer_token) for m in ours[-keep_last:]} | {(newest, self.token)}
        if protected is not None:
            keep.add(protected)
        scored = [m for m in ours if best_metric and best_metric in m.metrics]
        if scored:
            pick = min if best_mode == "min" else max
            best = pick(scored, key=lambda m: m.metrics[best_metric])
            keep.add((best.step, best.writer_token))
        complete = {(m.step, m.writer_token) for m in ours}
        doomed = [
            (step, token)
            for step, token in self.entries()
            if self._may_delete(token)
            and (step, token) not in keep
            and ((step, token) in complete or step < newest)
        ]
        for step, token in doomed:
            # Remove the manifest first so a concurrent reader never sees a complete-looking partial folder.
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(f"{self.step_path(step, token)}/{MANIFEST}")
            self.fs.rm(self.step_path(step, token), recursive=True)
        return [step for step, _ in doomed]


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_torch(fs: fsspec.AbstractFileSystem, path: str, obj: Any) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as fh:
        fh.write(buf.getvalue())


def _read_torch(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    with fs.open(path, "rb") as fh:
        return torch.load(io.BytesIO(fh.read()), weights_only=False)


class _ReusableStager(BlockingAsyncStager):
    """Copies the state into CPU buffers kept from one asynchronous save to the next (pinned when a GPU
    is there): allocating and faulting in fresh buffers costs several times the copy itself. Safe because
    a save waits for the previous one before staging."""

    def __init__(self) -> None:
        super().__init__(cache_staged_state_dict=True)
        self._signature: list[tuple[str, tuple[int, ...], torch.dtype]] | None = None

    @staticmethod
    def _describe(state: dict[str, Any], prefix: str = "") -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        out = []
        for key, value in state.items():
            if isinstance(value, dict):
                out.extend(_ReusableStager._describe(value, f"{prefix}{key}."))
            elif isinstance(value, torch.Tensor):
                out.append((f"{prefix}{key}", tuple(value.shape), value.dtype))
        return out

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        signature = self._describe(state_dict)
        if self.state_dict_cache is None or signature != self._signature:
            self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
            self._signature = signature
        return _copy_state_dict(state_dict, self.state_dict_cache)


@dataclass(frozen=True)
class Restored:
    manifest: Manifest
    trainer: dict[str, Any]
    rng_restored: bool
    """False when this rank had no saved RNG state (the run grew); it was reseeded instead."""


class Checkpointer:
    """Saves and restores one training run's state on every rank; synchronously or asynchronously.

    Asynchronous saves copy the state to CPU memory (the only stall), then a background thread writes it
    and, on rank 0, writes the manifest. At most one save is in flight: the next one waits for it.
    """

    def __init__(
        self,
        store: CheckpointStore,
        rank: int,
        world_size: int,
        group: dist.ProcessGroup | None,
        *,
        async_save: bool = False,
        keep_last: int = 2,
        best_metric: str | None = None,
        best_mode: str = "min",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.async_save = async_save
        self.keep_last = keep_last
        self.best_metric = best_metric
        self.best_mode = best_mode
        self.clock = clock
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt")
        self._pending: concurrent.futures.Future[None] | None = None
        self._lock = threading.Lock()
        self._latest: CheckpointRecord | None = None
        # The checkpoint the control plane recorded as the job's newest (step, writer token): the one a
        # retry resumes from, which retention keeps until a newer one is recorded, even when reports
        # of newer saves were lost (a partition, an outage).
        self._recorded: tuple[int, int | None] | None = None
        self._abandoned = threading.Event()
        self.stalls_s: list[float] = []
        self._stager = _ReusableStager()

    @property
    def latest(self) -> CheckpointRecord | None:
        """The newest checkpoint known durable (manifest written)."""
        with self._lock:
            return self._latest

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        trainer: dict[str, Any],
        metrics: dict[str, float],
        run: dict[str, str | None],
        *,
        force_sync: bool = False,
    ) -> None:
        """Checkpoint `step` on every rank (a collective). Returns once the state is safe to mutate: at
        once for an asynchronous save, after the manifest is written for a synchronous one."""
        started = self.clock()
        self.wait()
        if self.store.fs.exists(f"{self.store.step_path(step)}/{MANIFEST}"):
            raise CheckpointError(f"checkpoint {self.store.step_url(step)} is already complete")
        if self.rank == 0:
            self.store.clear_incomplete(step)
        if self.group is not None and self.world_size > 1:
            dist.barrier(group=self.group)
        step_url = self.store.step_url(step)
        _write_torch(self.store.fs, f"{self.store.step_path(step)}/rng/rank-{self.rank}.pt", capture_rng())
        msd, osd = get_state_dict(model, optimizer, options=_state_options(FORMAT_VERSION))
        state = {"model": msd, "optim": osd}
        trainer = {**trainer, "step": step, "metrics": dict(metrics)}
        if self.async_save and not force_sync:
            response = dcp.async_save(
                state,
                storage_writer=FsspecWriter(f"{step_url}/state", **self.store.options),
                process_group=self.group,
                async_stager=self._stager,
            )
            upload = response.upload_completion if hasattr(response, "upload_completion") else response
            self.stalls_s.append(self.clock() - started)
            self._pending = self._pool.submit(self._complete, upload, step, trainer, metrics, run, started)
        else:
            dcp.save(
                state,
                storage_writer=FsspecWriter(f"{step_url}/state", **self.store.options),
                process_group=self.group,
            )
            self._complete(None, step, trainer, metrics, run, started)
            if self.group is not None:
                dist.barrier(group=self.group)
            self.stalls_s.append(self.clock() - started)

    def _complete(
        self,
        upload: concurrent.futures.Future[Any] | None,
        step: int,
        trainer: dict[str, Any],
        metrics: dict[str, float],
        run: dict[str, str | None],
        started: float,
    ) -> None:
        if upload is not None:
            upload.result()
        # Each rank hashes the files it wrote; rank 0 gathers the digests and hashes the rest.
        mine = [
            r
            for r in self.store.relative_files(step)
            if r == f"rng/rank-{self.rank}.pt" or re.fullmatch(rf"state/__{self.rank}_\d+\.distcp", r)
        ]
        digests = self.store.describe(step, mine)
        gathered: list[Any] = [None] * self.world_size
        if self.group is not None and self.world_size > 1:
            dist.gather_object(digests, gathered if self.rank == 0 else None, dst=0, group=self.group)
        else:
            gathered = [digests]
        if self.rank != 0 or self._abandoned.is_set():
            return
        known = {k: v for d in gathered for k, v in d.items()}
        _write_torch(self.store.fs, f"{self.store.step_path(step)}/trainer.pt", trainer)
        cost = self.clock() - started
        manifest = self.store.finalize(step, self.world_size, metrics, run, cost, known)
        with self._lock:
            self._latest = CheckpointRecord(
                self.store.step_url(step),
                step,
                datetime.fromisoformat(manifest.saved_at),
                cost,
                manifest.bytes,
            )
        deleted = self.store.apply_retention(
            self.keep_last, self.best_metric, self.best_mode, step, protected=self._recorded
        )
        if deleted:
            log.info("retention removed checkpoints at steps %s", deleted)

    def recorded_by_control_plane(self, url: str) -> None:
        """The control plane recorded the checkpoint at `url` as the job's newest (a heartbeat carrying
        it was answered, or a retry was handed it to resume from): retention keeps it from now on."""
        found = _STEP_DIR.search(url.rstrip("/"))
        if found is not None:
            self._recorded = (int(found[1]), int(found[2]) if found[2] is not None else None)

    def abandon(self) -> None:
        """Never write another manifest (stale fencing token: a successor may own the checkpoints now).
        A save in flight finishes its data files, which stay incomplete and are never read."""
        self._abandoned.set()

    def wait(self) -> None:
        """Block until the in-flight asynchronous save (if any) is durable; re-raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)

    def find_latest(self, verify_checksums: bool = True, recorded: str | None = None) -> Manifest | None:
        """Rank 0 picks the checkpoint to resume from and tells every rank (a collective): the one the
        control plane recorded (`recorded`, its URL) when it is intact, else the newest intact one."""
        box: list[Any] = [None]
        if recorded:
            self.recorded_by_control_plane(recorded)
        if self.rank == 0:
            found = self.store.recorded(recorded, verify_checksums) or self.store.latest(verify_checksums)
            box[0] = asdict(found) if found is not None else None
        if self.group is not None and self.world_size > 1:
            dist.broadcast_object_list(box, src=0, group=self.group)
        return Manifest(**box[0]) if box[0] is not None else None

    def restore(self, manifest: Manifest, model: nn.Module, optimizer: torch.optim.Optimizer) -> Restored:
        """Load model and optimizer (resharded to this world), this rank's RNG, and the trainer state."""
        step_url = self.store.step_url(manifest.step, manifest.writer_token)
        options = _state_options(manifest.format_version)
        msd, osd = get_state_dict(model, optimizer, options=options)
        state = {"model": msd, "optim": osd}
        reader = FsspecReader(f"{step_url}/state", **self.store.options)
        dcp.load(state, storage_reader=reader, process_group=self.group)
        loaded = {"model_state_dict": state["model"], "optim_state_dict": state["optim"]}
        set_state_dict(model, optimizer, **loaded, options=options)
        base = self.store.step_path(manifest.step, manifest.writer_token)
        trainer = _read_torch(self.store.fs, f"{base}/trainer.pt")
        rng_path = f"{base}/rng/rank-{self.rank}.pt"
        rng_restored = self.store.fs.exists(rng_path)
        if rng_restored:
            restore_rng(_read_torch(self.store.fs, rng_path))
        with self._lock:
            saved_at = datetime.fromisoformat(manifest.saved_at)
            self._latest = CheckpointRecord(
                step_url, manifest.step, saved_at, manifest.cost_s, manifest.bytes
            )
        return Restored(manifest, trainer, rng_restored)


def read_model_state(step_url: str) -> dict[str, torch.Tensor]:
    """The full (unsharded) model weights of one checkpoint, read in this process without a process group."""
    reader = FsspecReader(f"{step_url.rstrip('/')}/state", **storage_options(step_url))
    metadata = reader.read_metadata()
    template = {
        key.removeprefix("model."): torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    state = {"model": template}
    dcp.load(state, storage_reader=reader, no_dist=True)
    return state["model"]
