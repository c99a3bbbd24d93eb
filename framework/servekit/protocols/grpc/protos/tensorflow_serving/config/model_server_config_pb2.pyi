from google.protobuf import any_pb2 as _any_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_TYPE_UNSPECIFIED: _ClassVar[ModelType]
    TENSORFLOW: _ClassVar[ModelType]
    OTHER: _ClassVar[ModelType]
MODEL_TYPE_UNSPECIFIED: ModelType
TENSORFLOW: ModelType
OTHER: ModelType

class FileSystemStoragePathSourceConfig(_message.Message):
    __slots__ = ()
    class ServableVersionPolicy(_message.Message):
        __slots__ = ("latest", "all", "specific")
        class Latest(_message.Message):
            __slots__ = ("num_versions",)
            NUM_VERSIONS_FIELD_NUMBER: _ClassVar[int]
            num_versions: int
            def __init__(self, num_versions: _Optional[int] = ...) -> None: ...
        class All(_message.Message):
            __slots__ = ()
            def __init__(self) -> None: ...
        class Specific(_message.Message):
            __slots__ = ("versions",)
            VERSIONS_FIELD_NUMBER: _ClassVar[int]
            versions: _containers.RepeatedScalarFieldContainer[int]
            def __init__(self, versions: _Optional[_Iterable[int]] = ...) -> None: ...
        LATEST_FIELD_NUMBER: _ClassVar[int]
        ALL_FIELD_NUMBER: _ClassVar[int]
        SPECIFIC_FIELD_NUMBER: _ClassVar[int]
        latest: FileSystemStoragePathSourceConfig.ServableVersionPolicy.Latest
        all: FileSystemStoragePathSourceConfig.ServableVersionPolicy.All
        specific: FileSystemStoragePathSourceConfig.ServableVersionPolicy.Specific
        def __init__(self, latest: _Optional[_Union[FileSystemStoragePathSourceConfig.ServableVersionPolicy.Latest, _Mapping]] = ..., all: _Optional[_Union[FileSystemStoragePathSourceConfig.ServableVersionPolicy.All, _Mapping]] = ..., specific: _Optional[_Union[FileSystemStoragePathSourceConfig.ServableVersionPolicy.Specific, _Mapping]] = ...) -> None: ...
    def __init__(self) -> None: ...

class LogCollectorConfig(_message.Message):
    __slots__ = ("type", "filename_prefix")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    FILENAME_PREFIX_FIELD_NUMBER: _ClassVar[int]
    type: str
    filename_prefix: str
    def __init__(self, type: _Optional[str] = ..., filename_prefix: _Optional[str] = ...) -> None: ...

class SamplingConfig(_message.Message):
    __slots__ = ("sampling_rate", "attributes")
    SAMPLING_RATE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    sampling_rate: float
    attributes: int
    def __init__(self, sampling_rate: _Optional[float] = ..., attributes: _Optional[int] = ...) -> None: ...

class LoggingConfig(_message.Message):
    __slots__ = ("log_collector_config", "sampling_config", "custom_logging_config")
    LOG_COLLECTOR_CONFIG_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_CONFIG_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_LOGGING_CONFIG_FIELD_NUMBER: _ClassVar[int]
    log_collector_config: LogCollectorConfig
    sampling_config: SamplingConfig
    custom_logging_config: _any_pb2.Any
    def __init__(self, log_collector_config: _Optional[_Union[LogCollectorConfig, _Mapping]] = ..., sampling_config: _Optional[_Union[SamplingConfig, _Mapping]] = ..., custom_logging_config: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...

class ModelConfig(_message.Message):
    __slots__ = ("name", "base_path", "model_type", "model_platform", "model_version_policy", "version_labels", "logging_config")
    class VersionLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_PATH_FIELD_NUMBER: _ClassVar[int]
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_PLATFORM_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_LABELS_FIELD_NUMBER: _ClassVar[int]
    LOGGING_CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    base_path: str
    model_type: ModelType
    model_platform: str
    model_version_policy: FileSystemStoragePathSourceConfig.ServableVersionPolicy
    version_labels: _containers.ScalarMap[str, int]
    logging_config: LoggingConfig
    def __init__(self, name: _Optional[str] = ..., base_path: _Optional[str] = ..., model_type: _Optional[_Union[ModelType, str]] = ..., model_platform: _Optional[str] = ..., model_version_policy: _Optional[_Union[FileSystemStoragePathSourceConfig.ServableVersionPolicy, _Mapping]] = ..., version_labels: _Optional[_Mapping[str, int]] = ..., logging_config: _Optional[_Union[LoggingConfig, _Mapping]] = ...) -> None: ...

class ModelConfigList(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: _containers.RepeatedCompositeFieldContainer[ModelConfig]
    def __init__(self, config: _Optional[_Iterable[_Union[ModelConfig, _Mapping]]] = ...) -> None: ...

class ModelServerConfig(_message.Message):
    __slots__ = ("model_config_list", "custom_model_config")
    MODEL_CONFIG_LIST_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_MODEL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    model_config_list: ModelConfigList
    custom_model_config: _any_pb2.Any
    def __init__(self, model_config_list: _Optional[_Union[ModelConfigList, _Mapping]] = ..., custom_model_config: _Optional[_Union[_any_pb2.Any, _Mapping]] = ...) -> None: ...
