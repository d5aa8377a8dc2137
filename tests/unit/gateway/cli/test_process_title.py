"""Keys given as flags are masked in the process title, in every form argparse takes them."""

from __future__ import annotations

import pytest

from gateway.cli import process_title
from gateway.cli.process_title import masked

KEY, ADMIN = "sk-live-5b1e", "sk-admin-77d0"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["mmgate", "serve", "--api-key", KEY], ["mmgate", "serve", "--api-key", "***"]),
        (["mmgate", "serve", f"--api-key={KEY}"], ["mmgate", "serve", "--api-key=***"]),
        (["mmgate", "serve", "--api-k", KEY], ["mmgate", "serve", "--api-k", "***"]),
        (["mmgate", "--tenant-api-key", f"red:{KEY}"], ["mmgate", "--tenant-api-key", "red:***"]),
        (
            ["mmgate", "--api-key", KEY, "--admin-api-key", ADMIN],
            ["mmgate", "--api-key", "***", "--admin-api-key", "***"],
        ),
    ],
)
def test_every_form_of_a_key_flag_is_masked(argv, expected):
    assert masked(argv, [KEY, ADMIN]) == expected


def test_a_key_holding_a_shorter_key_is_masked_whole():
    assert masked(["--api-key", "abc-long", "--api-key", "abc"], ["abc", "abc-long"]) == [
        "--api-key",
        "***",
        "--api-key",
        "***",
    ]


def test_no_key_on_the_command_line_leaves_the_title_alone(monkeypatch):
    calls = []
    monkeypatch.setattr("setproctitle.setproctitle", calls.append)
    assert masked(["mmgate", "serve", "--api-key-file", "/run/keys"], [KEY, ""]) is None
    assert not process_title.hide_secrets([KEY], ["mmgate", "serve", "--api-key-file", "k"])
    assert process_title.hide_secrets([KEY], ["mmgate", "serve", "--api-key", KEY])
    assert calls == ["mmgate serve --api-key ***"]
