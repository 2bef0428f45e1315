"""TensorFlow's ``Example`` protocol buffers, built at import time without protoc.

The messages have the exact wire format of ``tensorflow/core/example/example.proto`` and
``feature.proto`` (package ``tensorflow``), so records written by either library parse in the
other::

    message BytesList { repeated bytes value = 1; }
    message FloatList { repeated float value = 1 [packed = true]; }
    message Int64List { repeated int64 value = 1 [packed = true]; }
    message Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                   Int64List int64_list = 3; } }
    message Features { map<string, Feature> feature = 1; }
    message Example { Features features = 1; }

They live in a private descriptor pool, so importing TensorFlow in the same process does not
clash with them.

Example:
  >>> ex = Example(features=Features(feature={"x": Feature(int64_list=Int64List(value=[7]))}))
  >>> ex.SerializeToString().hex()
  '0a0c0a0a0a017812051a030a0107'
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

__all__ = ["BytesList", "Example", "Feature", "Features", "FloatList", "Int64List"]

_Field = descriptor_pb2.FieldDescriptorProto


def _field(
    name: str,
    number: int,
    kind: _Field.Type.ValueType,
    label: _Field.Label.ValueType = _Field.LABEL_OPTIONAL,
    type_name: str = "",
    packed: bool = False,
    oneof_index: int | None = None,
) -> _Field:
    field = _Field(name=name, number=number, type=kind, label=label, json_name=_camel(name))
    if type_name:
        field.type_name = type_name
    if packed:
        field.options.packed = True
    if oneof_index is not None:
        field.oneof_index = oneof_index
    return field


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="feedline/io/example.proto", package="tensorflow", syntax="proto3"
    )
    repeated = _Field.LABEL_REPEATED
    for name, kind, packed in (
        ("BytesList", _Field.TYPE_BYTES, False),
        ("FloatList", _Field.TYPE_FLOAT, True),
        ("Int64List", _Field.TYPE_INT64, True),
    ):
        message = proto.message_type.add(name=name)
        message.field.append(_field("value", 1, kind, repeated, packed=packed))

    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, type_name) in enumerate(
        (
            ("bytes_list", ".tensorflow.BytesList"),
            ("float_list", ".tensorflow.FloatList"),
            ("int64_list", ".tensorflow.Int64List"),
        ),
        start=1,
    ):
        feature.field.append(
            _field(name, number, _Field.TYPE_MESSAGE, type_name=type_name, oneof_index=0)
        )

    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.append(_field("key", 1, _Field.TYPE_STRING))
    entry.field.append(_field("value", 2, _Field.TYPE_MESSAGE, type_name=".tensorflow.Feature"))
    features.field.append(
        _field(
            "feature",
            1,
            _Field.TYPE_MESSAGE,
            repeated,
            type_name=".tensorflow.Features.FeatureEntry",
        )
    )

    example = proto.message_type.add(name="Example")
    example.field.append(
        _field("features", 1, _Field.TYPE_MESSAGE, type_name=".tensorflow.Features")
    )
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def _message(name: str) -> type[Message]:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"tensorflow.{name}"))


BytesList = _message("BytesList")
FloatList = _message("FloatList")
Int64List = _message("Int64List")
Feature = _message("Feature")
Features = _message("Features")
Example = _message("Example")
