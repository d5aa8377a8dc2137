"""Builds every message of a proto module with every field set, for the cross-package wire test.

Run as a script it is the far side of that test:
`python -m tests.support.wire_fill encode|decode MODULE` with MODULE `protos` (ours) or
`smg_grpc_proto` (upstream), so each package is loaded in a process of its own (in one process
the two would share one descriptor pool and one class).
"""

from __future__ import annotations

import base64
import importlib
import json
import sys
from collections.abc import Iterator

from google.protobuf import descriptor as d
from google.protobuf.json_format import MessageToDict

SCALARS = {
    d.FieldDescriptor.TYPE_DOUBLE: 1.5,
    d.FieldDescriptor.TYPE_FLOAT: 2.5,
    d.FieldDescriptor.TYPE_INT64: -(2**40),
    d.FieldDescriptor.TYPE_UINT64: 2**50,
    d.FieldDescriptor.TYPE_INT32: -7,
    d.FieldDescriptor.TYPE_UINT32: 4_000_000_000,
    d.FieldDescriptor.TYPE_BOOL: True,
    d.FieldDescriptor.TYPE_STRING: "välue",
    d.FieldDescriptor.TYPE_BYTES: b"\x00\xffbytes",
    d.FieldDescriptor.TYPE_SINT32: -9,
    d.FieldDescriptor.TYPE_SINT64: -(2**45),
}


def modules(package: str) -> tuple:
    if package == "protos":
        return (
            importlib.import_module("protos.common_pb2"),
            importlib.import_module("protos.vllm_engine_pb2"),
        )
    return (
        importlib.import_module("smg_grpc_proto.generated.common_pb2"),
        importlib.import_module("smg_grpc_proto.generated.vllm_engine_pb2"),
    )


def message_classes(package: str) -> dict[str, type]:
    from google.protobuf import message_factory

    found = {}
    for module in modules(package):
        for desc in _all_messages(module.DESCRIPTOR.message_types_by_name.values()):
            if not desc.GetOptions().map_entry:
                found[desc.full_name] = message_factory.GetMessageClass(desc)
    return found


def _all_messages(descs) -> Iterator:
    for desc in descs:
        yield desc
        yield from _all_messages(desc.nested_types)


def variants(cls: type) -> Iterator[tuple[str, object]]:
    """One fully set message per member of its widest oneof (so every field is set somewhere)."""
    desc = cls.DESCRIPTOR
    real = [o for o in desc.oneofs if not _synthetic(o)]
    widest = max(real, key=lambda o: len(o.fields), default=None)
    for choice in widest.fields if widest else [None]:
        msg = cls()
        fill(msg, prefer=choice, depth=0)
        yield (choice.name if choice else "all"), msg


def _synthetic(oneof) -> bool:
    return len(oneof.fields) == 1 and oneof.name == "_" + oneof.fields[0].name


def fill(msg, prefer=None, depth: int = 0) -> None:
    desc = msg.DESCRIPTOR
    chosen = {
        o.name: (prefer if prefer in o.fields else o.fields[0])
        for o in desc.oneofs
        if not _synthetic(o)
    }
    for field in desc.fields:
        oneof = field.containing_oneof
        if oneof is not None and not _synthetic(oneof) and chosen[oneof.name] is not field:
            continue
        _set(msg, field, depth)


def _set(msg, field, depth: int) -> None:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_f, val_f = (
            field.message_type.fields_by_name["key"],
            field.message_type.fields_by_name["value"],
        )
        key = SCALARS[key_f.type]
        target = getattr(msg, field.name)
        if val_f.message_type is not None:
            fill(target[key], depth=depth + 1)
        else:
            target[key] = _scalar(val_f)
        return
    if field.message_type is not None:
        if depth > 3:
            return
        if field.is_repeated:
            for _ in range(2):
                fill(getattr(msg, field.name).add(), depth=depth + 1)
        else:
            fill(getattr(msg, field.name), depth=depth + 1)
            getattr(msg, field.name).SetInParent()
        return
    value = _scalar(field)
    if field.is_repeated:
        getattr(msg, field.name).extend([value, value])
    else:
        setattr(msg, field.name, value)


def _scalar(field):
    if field.type == d.FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values[-1].number
    return SCALARS[field.type]


def _to_dict(msg) -> dict:
    return MessageToDict(msg, preserving_proto_field_name=True)


def encode_all(package: str) -> list[dict]:
    return [
        {
            "type": name,
            "variant": variant,
            "bytes": base64.b64encode(msg.SerializeToString()).decode(),
            "dict": _to_dict(msg),
        }
        for name, cls in sorted(message_classes(package).items())
        for variant, msg in variants(cls)
    ]


def decode_all(package: str, encoded: list[dict]) -> list[dict]:
    classes = message_classes(package)
    out = []
    for item in encoded:
        msg = classes[item["type"]]()
        msg.ParseFromString(base64.b64decode(item["bytes"]))
        out.append({"type": item["type"], "variant": item["variant"], "dict": _to_dict(msg)})
    return out


def file_descriptors(package: str) -> dict[str, str]:
    from google.protobuf import descriptor_pb2

    out = {}
    for module in modules(package):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        out[proto.name] = base64.b64encode(proto.SerializeToString(deterministic=True)).decode()
    return out


def main() -> int:
    command, package = sys.argv[1], sys.argv[2]
    if command == "encode":
        json.dump(encode_all(package), sys.stdout)
    elif command == "decode":
        json.dump(decode_all(package, json.load(sys.stdin)), sys.stdout)
    elif command == "descriptors":
        json.dump(file_descriptors(package), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
