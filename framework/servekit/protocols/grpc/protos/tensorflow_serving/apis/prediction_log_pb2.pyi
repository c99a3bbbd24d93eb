from servekit.protocols.grpc.protos.tensorflow_serving.apis import predict_pb2 as _predict_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PredictLog(_message.Message):
    __slots__ = ("request", "response")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    request: _predict_pb2.PredictRequest
    response: _predict_pb2.PredictResponse
    def __init__(self, request: _Optional[_Union[_predict_pb2.PredictRequest, _Mapping]] = ..., response: _Optional[_Union[_predict_pb2.PredictResponse, _Mapping]] = ...) -> None: ...

class PredictionLog(_message.Message):
    __slots__ = ("predict_log",)
    PREDICT_LOG_FIELD_NUMBER: _ClassVar[int]
    predict_log: PredictLog
    def __init__(self, predict_log: _Optional[_Union[PredictLog, _Mapping]] = ...) -> None: ...
