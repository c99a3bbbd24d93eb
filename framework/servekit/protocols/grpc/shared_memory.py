"""Triton's shared-memory RPCs of ``inference.GRPCInferenceService`` (tritonclient.grpc's calls).

``SystemSharedMemoryStatus``, ``...Register`` and ``...Unregister`` answer from
and change the regions every worker shares (:mod:`servekit.codecs.shared_memory`), as
``/v2/systemsharedmemory/...`` does over HTTP; the CUDA ones answer as a server
without CUDA: an empty status, an unregister that succeeds, a register refused.

The messages live in their own proto (``protos/inference/shared_memory.proto``)
and the methods in a handler of their own under the service's name, beside the
generated servicer of the other RPCs.
"""

from __future__ import annotations

from typing import Any

import grpc

from servekit.codecs import shared_memory
from servekit.errors import BadRequest, NotFound
from servekit.protocols.grpc.common import control_of, rpc
from servekit.protocols.grpc.protos.inference import shared_memory_pb2 as pb

SERVICE = "inference.GRPCInferenceService"


class SharedMemoryServicer:
    def __init__(self, dataplane: Any, control: Any = None):
        self.dp = dataplane
        self.control = control

    @rpc
    def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest, context: Any):
        response = pb.SystemSharedMemoryStatusResponse()
        for entry in self.dp.shared_memory.status(request.name or None):
            response.regions[entry["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**entry))
        return response

    @rpc
    def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest, context: Any):
        control_of(self).register_region(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc
    def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any):
        control_of(self).unregister_region(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @rpc
    def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest, context: Any):
        if request.name:
            raise NotFound(f"Unable to find cuda shared memory region: '{request.name}'")
        return pb.CudaSharedMemoryStatusResponse()

    @rpc
    def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest, context: Any):
        raise BadRequest(f"failed to register CUDA shared memory region '{request.name}': {shared_memory.CUDA_REFUSED}")

    @rpc
    def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any):
        return pb.CudaSharedMemoryUnregisterResponse()  # nothing can be registered


def add_to_server(server: Any, dataplane: Any, control: Any = None) -> None:
    """Serve the methods beside :mod:`.v2`'s servicer (``control``: the app's control plane).

    Registered by name, as the generated ``add_*_to_server`` functions do, on a
    ``grpc.Server`` or the server's :class:`.dispatch.MethodTable`.
    """
    server.add_registered_method_handlers(SERVICE, methods(dataplane, control))


def methods(dataplane: Any, control: Any = None) -> dict[str, grpc.RpcMethodHandler]:
    """Method name -> handler, each parsing its request type."""
    servicer = SharedMemoryServicer(dataplane, control)
    handlers = {}
    for name in (
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
    ):
        request_type = getattr(pb, f"{name}Request")
        response_type = getattr(pb, f"{name}Response")
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
    return handlers
