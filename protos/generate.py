"""Regenerate the Python modules from the .proto files: `python -m protos.generate [--check]`.

protoc writes absolute imports (`import common_pb2`); they are rewritten to package-relative
ones so that `protos` works as an installed package beside other copies of these protos.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PROTO_FILES = ("common.proto", "vllm_engine.proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc  # test-time dependency only

    include = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    written = sorted(p for p in out_dir.iterdir() if p.name.endswith(GENERATED_SUFFIXES))
    for path in written:
        path.write_text(_relative_imports(path.read_text()))
    return written


def _relative_imports(source: str) -> str:
    return re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", source, flags=re.M)


def drifted_files() -> list[str]:
    """Names of generated files whose committed copy differs from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        return [p.name for p in fresh if (PROTO_DIR / p.name).read_bytes() != p.read_bytes()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed modules drift")
    if parser.parse_args().check:
        drift = drifted_files()
        if drift:
            print(
                f"out of date: {', '.join(drift)}; run python -m protos.generate", file=sys.stderr
            )
            return 1
        return 0
    for path in generate(PROTO_DIR):
        print(f"wrote {path.relative_to(PROTO_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
