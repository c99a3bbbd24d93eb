"""The private descriptor pool every generated ``*_pb2`` module here registers in.

Our messages have the same full names as TensorFlow's and TF Serving's (that
is what makes them wire-compatible and makes ``Any`` type URLs match), and
protobuf's default pool rejects a second definition of a name.  Registering
ours in their own pool lets ``tensorflow``, ``tensorflow_serving.apis`` and
servekit's stubs live in one process.  The well-known types our files import
are added first, since a pool resolves imports only from itself.
"""

from __future__ import annotations

from google.protobuf import any_pb2, descriptor_pool, wrappers_pb2

POOL = descriptor_pool.DescriptorPool()
for _well_known in (any_pb2, wrappers_pb2):
    POOL.AddSerializedFile(_well_known.DESCRIPTOR.serialized_pb)

__all__ = ["POOL"]
