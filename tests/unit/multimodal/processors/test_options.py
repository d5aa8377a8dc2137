"""The one validator of per-request processor options: every refusal names the key."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from multimodal.processors.options import NoOptions, OptionError, option, parse_options
from multimodal.processors.qwen_vl import QwenVLOptions, QwenVLSize


@dataclass(frozen=True)
class Inner:
    edge: int | None = option(minimum=1)


@dataclass(frozen=True)
class Every:
    count: int | None = option(minimum=0)
    scale: float | None = option()
    flag: bool | None = option()
    inner: Inner | None = None


def test_values_are_typed_and_unset_keys_stay_none():
    parsed = parse_options(Every, {"count": 0, "scale": 2, "inner": {"edge": 5}}, "Fam")
    assert parsed == Every(count=0, scale=2.0, flag=None, inner=Inner(edge=5))
    assert isinstance(parsed.scale, float)
    assert parse_options(Every, {"count": None}, "Fam") == Every()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"size": 1}, r"unsupported mm_processor_kwargs \['size'\] for Fam \(accepted: "
                      r"count, scale, flag, inner\)"),
        ({"count": -1}, r"^mm_processor_kwargs\.count must be a non-negative integer$"),
        ({"count": True}, r"^mm_processor_kwargs\.count must be a non-negative integer$"),
        ({"count": 1.5}, r"^mm_processor_kwargs\.count must be a non-negative integer$"),
        ({"scale": "x"}, r"^mm_processor_kwargs\.scale must be a number$"),
        ({"flag": 1}, r"^mm_processor_kwargs\.flag must be true or false$"),
        ({"inner": [1]}, r"^mm_processor_kwargs\.inner must be an object$"),
        ({"inner": {"edge": 0}}, r"^mm_processor_kwargs\.inner\.edge must be a positive integer$"),
        ({"inner": {"side": 1}}, r"unsupported mm_processor_kwargs\.inner \['side'\] for Fam"),
    ],
)  # fmt: skip
def test_refusals_name_the_key(given, message):
    with pytest.raises(OptionError, match=message) as refused:
        parse_options(Every, given, "Fam")
    assert refused.value.status == 400 and refused.value.param == "mm_processor_kwargs"


def test_not_an_object_and_no_options():
    with pytest.raises(OptionError, match="mm_processor_kwargs must be an object"):
        parse_options(Every, [1], "Fam")
    assert parse_options(NoOptions, {}, "Fam") == NoOptions()
    with pytest.raises(OptionError, match=r"for Fam \(accepted: none\)"):
        parse_options(NoOptions, {"x": 1}, "Fam")


def test_qwen_vl_options_read_from_one_class():
    parsed = parse_options(QwenVLOptions, {"max_pixels": 9, "size": {"shortest_edge": 4}}, "Q")
    assert parsed == QwenVLOptions(max_pixels=9, size=QwenVLSize(shortest_edge=4))
