"""What it costs to put an image request's tensors on the wire: the protobuf message vs pieces.

    python -m benchmarks.wire_bench [--repeats N]

For Qwen2.5-VL's tensor shapes at several image sizes (uint8 patches as sent to engines that
normalize on device, float32 and bfloat16 as sent to the others), times the two ways the
gateway can build the bytes of a GenerateRequest with images:

- message: `multimodal_inputs` (in the preprocessing thread), then on the event loop
  `generate.mm_inputs.CopyFrom`, `SerializeToString` and the gRPC length prefix, which is
  what the gateway did before;
- pieces: `encode_multimodal_inputs` (in the thread), then on the event loop the request's
  own fields serialized, the mm_inputs field header and `gateway.transport.MessageBody`, whose views
  go to the socket as they are.

Both produce the same message (checked each run). Medians of `--repeats` runs, ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from gateway.transport import MessageBody
from multimodal.processors.base import ProcessedItems
from multimodal.wire import encode_multimodal_inputs, field_number, field_pieces, multimodal_inputs
from protos import vllm_engine_pb2 as pb

SIZES = ((640, 480), (1280, 960), (1920, 1080), (3840, 2160))
PATCH = 14 * 14 * 3 * 2  # Qwen2.5-VL: patch 14, 3 channels, temporal patch 2
MM_INPUTS = field_number(pb.GenerateRequest, "mm_inputs")


def qwen_grid(width: int, height: int) -> tuple[int, int]:
    """Patches down and across after Qwen2.5-VL's resize to multiples of 28 (default limits)."""
    return round(height / 28) * 2, round(width / 28) * 2


def processed_for(width: int, height: int, dtype: str) -> ProcessedItems:
    rows, cols = qwen_grid(width, height)
    rng = np.random.default_rng(0)
    shape = (rows * cols, PATCH)
    pixels = (
        rng.integers(0, 256, shape, dtype=np.uint8)
        if dtype == "uint8"
        else rng.standard_normal(shape, dtype=np.float32)
    )
    return ProcessedItems(
        tensors={"pixel_values": pixels, "image_grid_thw": np.array([[1, rows, cols]])},
        flat_keys={"pixel_values": "image_grid_thw"},
        keep_on_cpu_keys=("image_grid_thw",),
    )


def request() -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="chatcmpl-bench",
        tokenized=pb.TokenizedInput(input_ids=list(range(2000))),
        stream=True,
    )


def message_path(processed: ProcessedItems, dtype: str | None) -> tuple[float, float, int]:
    started = time.perf_counter()
    mm = multimodal_inputs(processed, [(5, 100)], ["0" * 64], dtype)
    built = time.perf_counter()
    generate = request()
    generate.mm_inputs.CopyFrom(mm)
    payload = generate.SerializeToString()
    body = memoryview(b"\x00" + len(payload).to_bytes(4, "big") + payload)
    return built - started, time.perf_counter() - built, len(body)


def pieces_path(processed: ProcessedItems, dtype: str | None) -> tuple[float, float, int]:
    started = time.perf_counter()
    pieces = encode_multimodal_inputs(processed, [(5, 100)], ["0" * 64], dtype)
    built = time.perf_counter()
    body = MessageBody([request().SerializeToString(), *field_pieces(MM_INPUTS, pieces)])
    return built - started, time.perf_counter() - built, len(body)


def same_message(processed: ProcessedItems, dtype: str | None) -> bool:
    pieces = encode_multimodal_inputs(processed, [(5, 100)], ["0" * 64], dtype)
    sent = b"".join([request().SerializeToString(), *field_pieces(MM_INPUTS, pieces)])
    want = request()
    want.mm_inputs.CopyFrom(multimodal_inputs(processed, [(5, 100)], ["0" * 64], dtype))
    return pb.GenerateRequest.FromString(sent) == want


def timed(path: Callable, processed: ProcessedItems, dtype: str | None, repeats: int):
    runs = [path(processed, dtype) for _ in range(repeats)]
    return (
        1000 * statistics.median(r[0] for r in runs),
        1000 * statistics.median(r[1] for r in runs),
        runs[0][2],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="runs per cell (median)")
    args = parser.parse_args()
    print(
        "| image | pixels | MB | message: thread / loop ms | pieces: thread / loop ms "
        "| loop saved | same |"
    )
    print("|---|---|---|---|---|---|---|")
    for width, height in SIZES:
        for wire in ("uint8", "float32", "bfloat16"):
            if wire != "uint8" and width > 1920:
                continue  # 200 MB of float32: nothing new to learn, minutes to run
            stored = "uint8" if wire == "uint8" else "float32"
            processed = processed_for(width, height, stored)
            dtype = None if wire == "uint8" else wire
            old_thread, old_loop, size = timed(message_path, processed, dtype, args.repeats)
            new_thread, new_loop, _ = timed(pieces_path, processed, dtype, args.repeats)
            same = "yes" if same_message(processed, dtype) else "NO"
            print(
                f"| {width}x{height} | {wire} | {size / 1e6:.1f} | {old_thread:.2f} / "
                f"{old_loop:.2f} | {new_thread:.3f} / {new_loop:.3f} | "
                f"{old_loop - new_loop:.2f} ms | {same} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
