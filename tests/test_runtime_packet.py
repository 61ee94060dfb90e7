"""docs/runtime_packet.md cannot drift: every module, function and test it names exists."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKET = ROOT / "docs" / "runtime_packet.md"
OWN_PACKAGES = {"clock", "config", "delivery", "loopback", "reminders", "workshops"}

TEST_REF = re.compile(r"^(tests/[\w/]+\.py)::(test_\w+)$")
CODE_REF = re.compile(r"^([a-z_][a-z0-9_]*)((?:\.[A-Za-z_][A-Za-z0-9_]*)+)$")


def _references() -> list[str]:
    return re.findall(r"`([^`\n]+)`", PACKET.read_text())


def _code_references() -> list[str]:
    refs = []
    for ref in _references():
        match = CODE_REF.match(ref)
        if match and match.group(1) in OWN_PACKAGES:
            refs.append(ref)
    return sorted(set(refs))


def _test_references() -> list[str]:
    return sorted({ref for ref in _references() if TEST_REF.match(ref)})


def _resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(dotted)


def test_packet_names_enough_code_and_tests_to_be_checked():
    assert len(_code_references()) >= 40
    assert len(_test_references()) >= 20


@pytest.mark.parametrize("ref", _code_references())
def test_every_named_module_and_function_exists(ref):
    assert _resolve(ref) is not None


@pytest.mark.parametrize("ref", _test_references())
def test_every_named_test_exists(ref):
    path, name = TEST_REF.match(ref).groups()
    source = (ROOT / path).read_text()
    assert re.search(rf"^def {name}\(", source, re.MULTILINE), f"{ref} is not defined"


def test_every_named_file_exists():
    files = [
        ref
        for ref in _references()
        if "/" in ref and "::" not in ref and not ref.startswith("http") and " " not in ref
    ]
    assert files
    for ref in files:
        assert (ROOT / ref).exists(), ref


def test_packet_has_no_placeholder_and_the_readme_links_it():
    text = PACKET.read_text()
    assert "CACHE_CONTRACT" not in text
    assert "docs/runtime_packet.md" in (ROOT / "README.md").read_text()
