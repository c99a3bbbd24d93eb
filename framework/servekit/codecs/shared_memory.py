"""Triton's system shared-memory extension: tensors in ``/dev/shm`` regions a client registered.

A client creates a POSIX shared-memory object (``shm_open``; tritonclient's
``utils.shared_memory``), registers it under a name with its key, offset and
size, and then names the region in a request instead of sending data: an
input's parameters ``shared_memory_region``, ``shared_memory_byte_size`` and
(optional) ``shared_memory_offset`` say where its bytes are (in the binary
layout of :mod:`servekit.codecs.v2`); the same parameters on a requested
output say where its answer goes, and the answer then carries only the
output's name, datatype, shape and where it was written.

Every worker of a server must see the same registrations, whichever worker a
register reached: the registered regions are part of the control plane's plan
(:mod:`servekit.control.plan`), so a register or unregister answers when every
worker applied it.  Each process maps a region from its key the first time a
request uses it (:class:`Regions`).

CUDA shared memory has no device here: its status is empty, an unregister
succeeds (Triton's examples call it first), a register is refused.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from servekit.errors import BadRequest, NotFound

#: Where Linux keeps POSIX shared-memory objects (``shm_open``'s names).
SHM_ROOT = Path("/dev/shm")
CUDA_REFUSED = "CUDA shared memory is not supported: servekit serves this model repository without CUDA IPC"

PARAMETERS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
#: What leaves a parameter unset (as :data:`servekit.codecs.infer_request.UNSET`: JSON's null, false, 0 and
#: "", and proto3's defaults, which a gRPC map entry may hold)
UNSET = (None, False, 0, "")


@dataclass(frozen=True)
class SharedTensor:
    """Where one tensor lives: a registered region's name, an offset in it and a byte size."""

    region: str
    byte_size: int
    offset: int = 0


def placement_of(params: dict[str, Any] | None, where: str) -> SharedTensor | None:
    """A tensor's shared-memory parameters, checked; ``None`` when it names no region."""
    if not params or params.get("shared_memory_region") in UNSET:
        for key in PARAMETERS[1:]:
            if params and params.get(key) not in UNSET:
                raise BadRequest(f"{where}: {key!r} needs a 'shared_memory_region' parameter")
        return None
    region = params["shared_memory_region"]
    if not isinstance(region, str):
        raise BadRequest(f"{where}: 'shared_memory_region' must be a string, found {region!r}")
    size = params.get("shared_memory_byte_size")
    if size is None:
        raise BadRequest(f"{where}: 'shared_memory_byte_size' must be given with 'shared_memory_region'")
    offset = params.get("shared_memory_offset", 0) or 0
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadRequest(f"{where}: {key!r} must be a non-negative integer, found {value!r}")
    return SharedTensor(region, size, offset)


def path_of(key: str) -> Path:
    """The file of a POSIX shared-memory object named ``key`` (``/name``, as ``shm_open`` takes it)."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", ".."):
        raise BadRequest(f"shared memory key {key!r} is not a POSIX shared-memory name ('/name')")
    return SHM_ROOT / name


def check_registration(name: str, key: Any, offset: Any, byte_size: Any) -> dict[str, Any]:
    """A register's arguments as a region entry, refused unless the object exists and holds them."""
    if not isinstance(name, str) or not name:
        raise BadRequest("a shared memory region needs a name")
    if not isinstance(key, str):
        raise BadRequest(f"shared memory region {name!r}: 'key' must be a string, found {key!r}")
    for field, value in (("offset", offset), ("byte_size", byte_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadRequest(
                f"shared memory region {name!r}: {field!r} must be a non-negative integer, found {value!r}"
            )
    path = path_of(key)
    try:
        size = path.stat().st_size
    except OSError:
        raise BadRequest(f"Unable to open shared memory region: '{key}'") from None
    if offset + byte_size > size:
        raise BadRequest(
            f"shared memory region {name!r}: offset {offset} + byte_size {byte_size} is past the end of "
            f"'{key}' ({size} bytes)"
        )
    return {"name": name, "key": key, "offset": offset, "byte_size": byte_size}


class Regions:
    """The registered regions as this process sees them, mapped on first use."""

    def __init__(self) -> None:
        self._entries: dict[str, dict[str, Any]] = {}
        self._maps: dict[str, tuple[tuple[Any, ...] | None, mmap.mmap]] = {}
        self._lock = threading.Lock()

    def apply(self, entries: dict[str, dict[str, Any]]) -> None:
        """Follow the plan's regions: a region dropped or changed is mapped afresh when used again."""
        with self._lock:
            self._entries = {name: dict(entry) for name, entry in entries.items()}
            for name in list(self._maps):
                if _identity(self._entries.get(name)) != self._maps[name][0]:
                    # views still held by a request keep the old mapping alive until they go
                    del self._maps[name]

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """Triton's status entries: every region, or the one named (404 when unknown)."""
        with self._lock:
            entries = self._entries
        if name:
            if name not in entries:
                raise NotFound(f"Unable to find system shared memory region: '{name}'")
            return [dict(entries[name])]
        return [dict(entries[n]) for n in sorted(entries)]

    def view(self, where: str, placement: SharedTensor) -> memoryview:
        """The bytes a tensor's parameters name, as a writable view of the mapping."""
        with self._lock:
            entry = self._entries.get(placement.region)
            if entry is None:
                raise BadRequest(f"{where}: Unable to find shared memory region: '{placement.region}'")
            if placement.offset + placement.byte_size > entry["byte_size"]:
                raise BadRequest(
                    f"{where}: Invalid offset + byte size for shared memory region: '{placement.region}' "
                    f"({placement.offset} + {placement.byte_size} > {entry['byte_size']})"
                )
            mapping = self._mapping(placement.region, entry)
        start = entry["offset"] + placement.offset
        return memoryview(mapping)[start : start + placement.byte_size]

    def _mapping(self, name: str, entry: dict[str, Any]) -> mmap.mmap:
        found = self._maps.get(name)
        if found is not None and found[0] == _identity(entry):
            return found[1]
        try:
            fd = os.open(path_of(entry["key"]), os.O_RDWR)
        except OSError as exc:
            raise BadRequest(f"Unable to open shared memory region: '{entry['key']}': {exc.strerror}") from None
        try:
            if os.fstat(fd).st_size < entry["offset"] + entry["byte_size"]:
                raise BadRequest(f"shared memory region {name!r}: '{entry['key']}' is smaller than registered")
            mapping = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self._maps[name] = (_identity(entry), mapping)
        return mapping

    def read(self, where: str, placement: SharedTensor) -> memoryview:
        """An input's bytes, read-only (the codec copies them: a model may change its inputs)."""
        return self.view(where, placement).toreadonly()

    def write(self, where: str, placement: SharedTensor, data: bytes) -> None:
        """An output's bytes into its region; refused when they do not fit."""
        if len(data) > placement.byte_size:
            raise BadRequest(
                f"shared memory size specified with the request for {where} ({placement.byte_size} bytes) "
                f"should be at least {len(data)} bytes to hold the results"
            )
        view = self.view(where, placement)
        view[: len(data)] = data


def _identity(entry: dict[str, Any] | None) -> tuple[Any, ...] | None:
    return None if entry is None else (entry["key"], entry["offset"], entry["byte_size"])


def write_outputs(
    regions: Regions, arrays: dict[str, np.ndarray], placements: dict[str, SharedTensor], to_bytes: Any
) -> dict[str, dict[str, Any]]:
    """Write the outputs a request placed in shared memory; their answer parameters, by name."""
    written = {}
    for name, placement in placements.items():
        if name not in arrays:
            continue
        data = to_bytes(arrays[name])
        regions.write(f"output {name!r}", placement, data)
        written[name] = {"shared_memory_region": placement.region, "shared_memory_byte_size": len(data)}
    return written
