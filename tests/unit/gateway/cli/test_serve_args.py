"""`mmgate serve` refuses bad worker addresses at start, before anything is served."""

from __future__ import annotations

import pytest

from gateway.cli.serve import main


@pytest.mark.parametrize("flag", ["--worker", "--worker-dns"])
def test_a_malformed_worker_address_is_a_usage_error(flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--model", str(tmp_path), flag, "http://engine:50051"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert (
        "must look like grpc://HOST:PORT or grpcs://HOST:PORT, got 'http://engine:50051'" in error
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reasoning-parser", "qwen4"], "unknown reasoning parser 'qwen4'; known: deepseek_r1"),
        (["--tool-call-parser", "hermes2"], "unknown tool call parser 'hermes2'; known: "),
        (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser"),
    ],
)
def test_parser_flags_are_checked_at_start(flags, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--model", str(tmp_path), "--worker", "grpc://127.0.0.1:1", *flags])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert message in error
    if "unknown" in message:
        assert "qwen3" in error  # the known names are listed


def test_tensor_transport_flags_are_smg_s(tmp_path, capsys):
    from gateway.cli.serve import build_parser

    base = ["--model", str(tmp_path), "--worker", "grpc://127.0.0.1:1"]
    args = build_parser().parse_args(base)
    assert (args.multimodal_tensor_transport, args.multimodal_shm_min_bytes) == ("auto", 1 << 20)
    args = build_parser().parse_args(
        [*base, "--multimodal-tensor-transport", "inline", "--multimodal-shm-min-bytes", "65536"]
    )
    assert (args.multimodal_tensor_transport, args.multimodal_shm_min_bytes) == ("inline", 65536)
    with pytest.raises(SystemExit):  # SMG's rdma lane is not ours
        build_parser().parse_args([*base, "--multimodal-tensor-transport", "rdma"])
    assert "invalid choice: 'rdma'" in capsys.readouterr().err


def test_the_media_cache_flag_is_vllm_s(tmp_path, capsys):
    from gateway.cli.serve import build_parser

    base = ["--model", str(tmp_path), "--worker", "grpc://127.0.0.1:1"]
    parser = build_parser()
    assert parser.parse_args(base).mm_processor_cache_gb == 4.0  # vLLM's default
    assert parser.parse_args([*base, "--mm-processor-cache-gb", "0"]).mm_processor_cache_gb == 0
    assert parser.parse_args([*base, "--mm-processor-cache-gb", "0.5"]).mm_processor_cache_gb == 0.5
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(SystemExit):
            parser.parse_args([*base, "--mm-processor-cache-gb", bad])
    assert "--mm-processor-cache-gb" in capsys.readouterr().err


def test_api_server_count_is_one_process_unless_asked(tmp_path, capsys):
    from gateway.cli.serve import build_parser

    base = ["--model", str(tmp_path), "--worker", "grpc://127.0.0.1:1"]
    assert build_parser().parse_args(base).api_server_count == 1
    assert build_parser().parse_args([*base, "--api-server-count", "4"]).api_server_count == 4
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--api-server-count", "0"])
    assert "must be at least 1, got 0" in capsys.readouterr().err


def test_audio_limits_default_to_vllm_s_and_the_policy_s(tmp_path):
    import vllm.envs as envs

    from gateway.cli.serve import build_parser
    from multimodal.policy import MediaPolicy

    base = ["--model", str(tmp_path), "--worker", "grpc://127.0.0.1:1"]
    args = build_parser().parse_args(base)
    policy = MediaPolicy()
    assert args.max_audio_bytes == policy.max_audio_bytes
    assert args.max_audio_bytes == envs.VLLM_MAX_AUDIO_CLIP_FILESIZE_MB << 20
    assert args.max_audio_seconds == policy.max_audio_seconds
    assert args.max_audio_seconds == envs.VLLM_MAX_AUDIO_DECODE_DURATION_S
    assert args.max_audio_decoded_mib << 20 == policy.max_audio_decoded_bytes
    assert policy.max_audio_decoded_bytes == envs.VLLM_MAX_AUDIO_DECODE_BYTES
    assert (args.max_audio_sample_rate, args.max_audio_channels) == (
        policy.max_audio_sample_rate,
        policy.max_audio_channels,
    )
    assert args.audio_decode_timeout == policy.audio_decode_timeout
