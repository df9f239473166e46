"""A stand-in for the gRPC message classes of the Functions host protocol (``FunctionRpc.proto``).

The real Python worker is two parts: a small proxy (the gRPC client, with the compiled protos)
that the Functions host starts, and the worker library ``azure-functions-runtime`` that indexes,
loads and invokes the app. Only the library is on PyPI; the proxy ships inside Core Tools and the
platform images. The library never imports the protos: the proxy hands it a ``protos`` module in
``WorkerRequest.properties["protos"]``. This module is that ``protos`` for our tests, and it is
the only part of the worker stack, with the gRPC transport, that is stood in.

Each class below has the fields of the real message (names and kinds as in ``FunctionRpc.proto``)
and behaves like a protobuf message where the library relies on it: an unknown field name raises
``ValueError``, scalar fields are type-checked, enum fields take a number or a label (never a
Python ``Enum`` that is not an int), ``Duration`` fields take a ``timedelta``, unset fields read as
their defaults (``""``, ``0``, ``False``, an empty message, map or list), ``None`` leaves a field
unset, nested enum values are class attributes (``StatusResult.Success``, ``BindingInfo.out``) and
``WhichOneof`` names the member of a oneof that is set. Defined: what ``azure_functions_runtime``
1.3.0 touches (``grep -rn "protos\\." azure_functions_runtime``) and the request messages a host
sends. There is no wire encoding.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any, ClassVar


class EnumType:
    """A protobuf enum: labels as attributes, ``Value(label)`` and ``Name(number)``."""

    def __init__(self, name: str, values: dict[str, int]) -> None:
        self._name = name
        self._values = dict(values)

    def __getattr__(self, label: str) -> int:
        values = self.__dict__.get("_values", {})
        if label in values:
            return int(values[label])
        raise AttributeError(label)

    def Value(self, label: str) -> int:
        if label not in self._values:
            raise ValueError(f"Enum {self._name} has no value defined for name {label!r}")
        return self._values[label]

    def Name(self, number: int) -> str:
        for label, value in self._values.items():
            if value == number:
                return label
        raise ValueError(f"Enum {self._name} has no name defined for value {number!r}")

    def items(self) -> list[tuple[str, int]]:
        return list(self._values.items())


_SCALAR_DEFAULTS: dict[str, Any] = {
    "string": "",
    "bytes": b"",
    "int": 0,
    "bool": False,
    "double": 0.0,
    "duration": dt.timedelta(0),
}


def _scalar_ok(kind: str, value: object) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "bytes":
        return isinstance(value, bytes | bytearray)
    if kind in ("int", "bool"):
        return isinstance(value, int)
    if kind == "double":
        return isinstance(value, int | float)
    if kind == "duration":
        return isinstance(value, dt.timedelta)
    raise AssertionError(f"unknown scalar kind {kind}")


class Message:
    """Base of the stand-in messages; see the module docstring for the protobuf behaviour kept.

    ``FIELDS`` maps a field name to its kind: a scalar (``string``, ``bytes``, ``int``, ``bool``,
    ``double``, ``duration``), ``enum:<Enum>`` (an enum of this class), ``msg:<Class>``,
    ``map:<value kind>`` (string keys) or ``repeated:<element kind>``.
    """

    FIELDS: ClassVar[dict[str, str]] = {}
    ONEOFS: ClassVar[dict[str, tuple[str, ...]]] = {}
    ENUMS: ClassVar[dict[str, EnumType]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for enum_name, enum in cls.ENUMS.items():
            setattr(cls, enum_name, enum)
            for label, number in enum.items():  # protobuf exposes nested enum values on the class
                setattr(cls, label, number)

    def __init__(self, **fields: Any) -> None:
        values: dict[str, Any] = {}
        for name, value in fields.items():
            if name not in self.FIELDS:
                raise ValueError(f'Protocol message {type(self).__name__} has no "{name}" field.')
            if value is None:
                continue
            values[name] = self._convert(name, self.FIELDS[name], value)
        for group, members in self.ONEOFS.items():
            chosen = [m for m in members if m in values]
            if len(chosen) > 1:
                raise ValueError(f"{type(self).__name__}: oneof `{group}` got {chosen}")
        object.__setattr__(self, "_values", values)

    def _convert(self, name: str, kind: str, value: Any) -> Any:
        where = f"{type(self).__name__}.{name}"
        if kind.startswith("repeated:"):
            if isinstance(value, str | bytes | dict) or not hasattr(value, "__iter__"):
                raise TypeError(f"{where}: expected a sequence, got {type(value).__name__}")
            return [self._convert(name, kind.removeprefix("repeated:"), v) for v in value]
        if kind.startswith("map:"):
            if not isinstance(value, dict):
                raise TypeError(f"{where}: expected a mapping, got {type(value).__name__}")
            inner = kind.removeprefix("map:")
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise TypeError(f"{where}: map keys must be str, got {key!r}")
                out[key] = self._convert(name, inner, item)
            return out
        if kind.startswith("msg:"):
            cls = _message_class(kind.removeprefix("msg:"))
            if not isinstance(value, cls):
                raise TypeError(f"{where}: expected {cls.__name__}, got {type(value).__name__}")
            return value
        if kind.startswith("enum:"):
            enum = self.ENUMS[kind.removeprefix("enum:")]
            if isinstance(value, str):
                return enum.Value(value)
            if not isinstance(value, int):
                raise TypeError(f"{where}: an enum field takes an int or a label, got {value!r}")
            return int(value)
        if not _scalar_ok(kind, value):
            raise TypeError(f"{where}: {value!r} has type {type(value).__name__}, not {kind}")
        return value

    def __getattr__(self, name: str) -> Any:
        fields = type(self).FIELDS
        if name.startswith("_") or name not in fields:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        values = self.__dict__["_values"]
        if name in values:
            return values[name]
        kind = fields[name]
        if kind.startswith("repeated:"):
            return []
        if kind.startswith("map:"):
            return {}
        if kind.startswith("msg:"):
            return _message_class(kind.removeprefix("msg:"))()
        if kind.startswith("enum:"):
            return 0
        return _SCALAR_DEFAULTS[kind]

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.FIELDS:
            raise AttributeError(f'Protocol message {type(self).__name__} has no "{name}" field.')
        self.__dict__["_values"][name] = self._convert(name, self.FIELDS[name], value)

    def WhichOneof(self, group: str) -> str | None:
        if group not in self.ONEOFS:
            raise ValueError(f'Protocol message has no "{group}" field.')
        values = self.__dict__["_values"]
        return next((m for m in self.ONEOFS[group] if m in values), None)

    def HasField(self, name: str) -> bool:
        return name in self.__dict__["_values"]

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, recursively, as JSON-ready values."""
        return {k: _plain(v) for k, v in self.__dict__["_values"].items()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"


def _plain(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value


def _message_class(name: str) -> type[Message]:
    cls = getattr(sys.modules[__name__], name, None)
    if not (isinstance(cls, type) and issubclass(cls, Message)):
        raise AssertionError(f"no stand-in message class {name}")
    return cls


# -- the messages -------------------------------------------------------------------------------


class Timestamp(Message):
    FIELDS: ClassVar[dict[str, str]] = {"seconds": "int", "nanos": "int"}


class NullableString(Message):
    FIELDS: ClassVar[dict[str, str]] = {"value": "string"}


class NullableDouble(Message):
    FIELDS: ClassVar[dict[str, str]] = {"value": "double"}


class NullableBool(Message):
    FIELDS: ClassVar[dict[str, str]] = {"value": "bool"}


class NullableTimestamp(Message):
    FIELDS: ClassVar[dict[str, str]] = {"value": "msg:Timestamp"}


class RpcException(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "source": "string",
        "stack_trace": "string",
        "message": "string",
        "is_user_exception": "bool",
        "type": "string",
    }


class RpcLog(Message):
    ENUMS: ClassVar[dict[str, EnumType]] = {
        "Level": EnumType(
            "Level",
            {
                "Trace": 0,
                "Debug": 1,
                "Information": 2,
                "Warning": 3,
                "Error": 4,
                "Critical": 5,
                "None": 6,
            },
        ),
        "RpcLogCategory": EnumType("RpcLogCategory", {"User": 0, "System": 1, "CustomMetric": 2}),
    }
    FIELDS: ClassVar[dict[str, str]] = {
        "invocation_id": "string",
        "category": "string",
        "level": "enum:Level",
        "message": "string",
        "event_id": "string",
        "exception": "msg:RpcException",
        "properties": "string",
        "log_category": "enum:RpcLogCategory",
    }


class StatusResult(Message):
    ENUMS: ClassVar[dict[str, EnumType]] = {
        "Status": EnumType("Status", {"Failure": 0, "Success": 1, "Cancelled": 2})
    }
    FIELDS: ClassVar[dict[str, str]] = {
        "status": "enum:Status",
        "result": "string",
        "exception": "msg:RpcException",
        "logs": "repeated:msg:RpcLog",
    }


class WorkerMetadata(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "runtime_name": "string",
        "runtime_version": "string",
        "worker_version": "string",
        "worker_bitness": "string",
        "custom_properties": "map:string",
    }


class WorkerInitRequest(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "host_version": "string",
        "capabilities": "map:string",
        "log_categories": "map:int",
        "worker_directory": "string",
        "function_app_directory": "string",
    }


class WorkerInitResponse(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "worker_version": "string",
        "capabilities": "map:string",
        "result": "msg:StatusResult",
        "worker_metadata": "msg:WorkerMetadata",
    }


class FunctionEnvironmentReloadRequest(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "environment_variables": "map:string",
        "function_app_directory": "string",
    }


class FunctionEnvironmentReloadResponse(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "worker_metadata": "msg:WorkerMetadata",
        "capabilities": "map:string",
        "result": "msg:StatusResult",
    }


class BindingInfo(Message):
    ENUMS: ClassVar[dict[str, EnumType]] = {
        "Direction": EnumType("Direction", {"in": 0, "out": 1, "inout": 2}),
        "DataType": EnumType("DataType", {"undefined": 0, "string": 1, "binary": 2, "stream": 3}),
    }
    FIELDS: ClassVar[dict[str, str]] = {
        "type": "string",
        "direction": "enum:Direction",
        "data_type": "enum:DataType",
        "properties": "map:string",
    }


class RpcRetryOptions(Message):
    ENUMS: ClassVar[dict[str, EnumType]] = {
        "RetryStrategy": EnumType("RetryStrategy", {"exponential_backoff": 0, "fixed_delay": 1})
    }
    FIELDS: ClassVar[dict[str, str]] = {
        "max_retry_count": "int",
        "delay_interval": "duration",
        "minimum_interval": "duration",
        "maximum_interval": "duration",
        "retry_strategy": "enum:RetryStrategy",
    }


class RpcFunctionMetadata(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "name": "string",
        "directory": "string",
        "script_file": "string",
        "entry_point": "string",
        "bindings": "map:msg:BindingInfo",
        "is_proxy": "bool",
        "status": "msg:StatusResult",
        "language": "string",
        "raw_bindings": "repeated:string",
        "function_id": "string",
        "managed_dependency_enabled": "bool",
        "retry_options": "msg:RpcRetryOptions",
        "properties": "map:string",
    }


class FunctionsMetadataRequest(Message):
    FIELDS: ClassVar[dict[str, str]] = {"function_app_directory": "string"}


class FunctionMetadataResponse(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "function_metadata_results": "repeated:msg:RpcFunctionMetadata",
        "result": "msg:StatusResult",
        "use_default_metadata_indexing": "bool",
    }


class FunctionLoadRequest(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "function_id": "string",
        "metadata": "msg:RpcFunctionMetadata",
        "managed_dependency_enabled": "bool",
    }


class FunctionLoadResponse(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "function_id": "string",
        "result": "msg:StatusResult",
        "is_dependency_downloaded": "bool",
    }


class CollectionString(Message):
    FIELDS: ClassVar[dict[str, str]] = {"string": "repeated:string"}


class CollectionBytes(Message):
    FIELDS: ClassVar[dict[str, str]] = {"bytes": "repeated:bytes"}


class CollectionDouble(Message):
    FIELDS: ClassVar[dict[str, str]] = {"double": "repeated:double"}


class CollectionSInt64(Message):
    FIELDS: ClassVar[dict[str, str]] = {"sint64": "repeated:int"}


class ModelBindingData(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "version": "string",
        "source": "string",
        "content_type": "string",
        "content": "bytes",
    }


class CollectionModelBindingData(Message):
    FIELDS: ClassVar[dict[str, str]] = {"model_binding_data": "repeated:msg:ModelBindingData"}


class RpcHttpCookie(Message):
    ENUMS: ClassVar[dict[str, EnumType]] = {
        "SameSite": EnumType("SameSite", {"None": 0, "Lax": 1, "Strict": 2, "ExplicitNone": 3})
    }
    FIELDS: ClassVar[dict[str, str]] = {
        "name": "string",
        "value": "string",
        "domain": "msg:NullableString",
        "path": "msg:NullableString",
        "expires": "msg:NullableTimestamp",
        "secure": "msg:NullableBool",
        "http_only": "msg:NullableBool",
        "same_site": "enum:SameSite",
        "max_age": "msg:NullableDouble",
    }


class RpcHttp(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "method": "string",
        "url": "string",
        "headers": "map:string",
        "body": "msg:TypedData",
        "params": "map:string",
        "status_code": "string",
        "query": "map:string",
        "enable_content_negotiation": "bool",
        "rawBody": "msg:TypedData",
        "cookies": "repeated:msg:RpcHttpCookie",
        "nullable_headers": "map:msg:NullableString",
        "nullable_params": "map:msg:NullableString",
        "nullable_query": "map:msg:NullableString",
    }


class TypedData(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "string": "string",
        "json": "string",
        "bytes": "bytes",
        "stream": "bytes",
        "http": "msg:RpcHttp",
        "int": "int",
        "double": "double",
        "collection_bytes": "msg:CollectionBytes",
        "collection_string": "msg:CollectionString",
        "collection_double": "msg:CollectionDouble",
        "collection_sint64": "msg:CollectionSInt64",
        "model_binding_data": "msg:ModelBindingData",
        "collection_model_binding_data": "msg:CollectionModelBindingData",
    }
    ONEOFS: ClassVar[dict[str, tuple[str, ...]]] = {"data": tuple(FIELDS)}


class RpcSharedMemory(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "name": "string",
        "offset": "int",
        "count": "int",
        "type": "int",
    }


class ParameterBinding(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "name": "string",
        "data": "msg:TypedData",
        "rpc_shared_memory": "msg:RpcSharedMemory",
    }
    ONEOFS: ClassVar[dict[str, tuple[str, ...]]] = {"rpc_data": ("data", "rpc_shared_memory")}


class RpcTraceContext(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "trace_parent": "string",
        "trace_state": "string",
        "attributes": "map:string",
    }


class RetryContext(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "retry_count": "int",
        "max_retry_count": "int",
        "exception": "msg:RpcException",
    }


class InvocationRequest(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "invocation_id": "string",
        "function_id": "string",
        "input_data": "repeated:msg:ParameterBinding",
        "trigger_metadata": "map:msg:TypedData",
        "trace_context": "msg:RpcTraceContext",
        "retry_context": "msg:RetryContext",
    }


class InvocationResponse(Message):
    FIELDS: ClassVar[dict[str, str]] = {
        "invocation_id": "string",
        "output_data": "repeated:msg:ParameterBinding",
        "return_value": "msg:TypedData",
        "result": "msg:StatusResult",
    }


class StreamingMessage(Message):
    _CONTENT: ClassVar[dict[str, str]] = {
        "worker_init_request": "msg:WorkerInitRequest",
        "worker_init_response": "msg:WorkerInitResponse",
        "function_environment_reload_request": "msg:FunctionEnvironmentReloadRequest",
        "function_environment_reload_response": "msg:FunctionEnvironmentReloadResponse",
        "functions_metadata_request": "msg:FunctionsMetadataRequest",
        "function_metadata_response": "msg:FunctionMetadataResponse",
        "function_load_request": "msg:FunctionLoadRequest",
        "function_load_response": "msg:FunctionLoadResponse",
        "invocation_request": "msg:InvocationRequest",
        "invocation_response": "msg:InvocationResponse",
    }
    FIELDS: ClassVar[dict[str, str]] = {"request_id": "string", **_CONTENT}
    ONEOFS: ClassVar[dict[str, tuple[str, ...]]] = {"content": tuple(_CONTENT)}
