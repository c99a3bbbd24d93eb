"""gRPC: TF Serving's ``PredictionService``/``ModelService`` and V2's ``GRPCInferenceService``.

Each module here translates one service's messages to the data plane and back;
the messages are servekit's own (``protos/``), wire-compatible with the public
APIs, so no TensorFlow is needed.  The server that carries them, started in
every worker, is the server layer's (:mod:`servekit.server.grpc_engine`).
"""
