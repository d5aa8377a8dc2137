"""The gateway's folders follow a request, and imports run one way along it: a stage imports
only the stages after it (and the bases every stage shares), never one before it or a sibling.
So `render`, `stream` and `workers` can be used and tested without the HTTP app, and wave 3's
new routes and media cannot tangle the path. Read from the source (every import, including
those inside functions), so a new file is held to it at once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GATEWAY = Path(__file__).parents[3] / "gateway"
# From the request's entry to its bases. A stage may import stages of later tiers only.
TIERS: list[set[str]] = [
    {"cli"},
    {"server"},
    {"api", "playground"},
    {"parsers", "render", "stream"},
    {"workers"},
    {"transport"},
    # rate limits' buckets and the meter generation charges (their middleware is server's)
    {"observability", "ratelimit"},
    {"errors"},
]
TIER = {stage: depth for depth, stages in enumerate(TIERS) for stage in stages}
# The gateway is CPU work in front of the engines: neither vLLM nor torch may be imported.
# `cli` is exempt: `mmgate` is one command for every job (`engine`, `demo`, `preprocess
# --compare-hf`), and it imports those jobs' packages only when they are run.
FORBIDDEN_PACKAGES = {"vllm", "torch", "torchvision", "transformers", "engine_server"}
SERVING_SOURCES = [p for p in sorted(GATEWAY.rglob("*.py")) if "cli" not in p.parts]


def _stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "gateway" and len(parts) > 1 else None


def _module_name(path: Path) -> str:
    relative = path.relative_to(GATEWAY.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, relative ones resolved."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            found.append((node.lineno, module))
            # `from gateway import server` names a stage too
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


SOURCES = sorted(GATEWAY.rglob("*.py"))


def test_every_stage_has_a_tier():
    stages = {p.relative_to(GATEWAY).parts[0].removesuffix(".py") for p in SOURCES}
    assert stages - {"__init__", "__main__"} <= TIER.keys()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(GATEWAY)))
def test_no_import_runs_back_up_the_stages(path: Path):
    own = _stage(_module_name(path))
    wrong = []
    for line, module in _imports(path):
        target = _stage(module)
        if own is None or target is None or target == own or target not in TIER:
            continue
        if TIER[target] <= TIER[own]:
            wrong.append(f"line {line}: {own} imports {module}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("path", SERVING_SOURCES, ids=lambda p: str(p.relative_to(GATEWAY)))
def test_the_gateway_needs_no_engine_packages(path: Path):
    wrong = [
        f"line {line}: {module}"
        for line, module in _imports(path)
        if module.split(".")[0] in FORBIDDEN_PACKAGES
    ]
    assert not wrong, "\n".join(wrong)
