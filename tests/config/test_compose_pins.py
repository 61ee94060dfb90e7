"""No image in docker-compose.yml or the Dockerfile is pinned below its floor.

A floor is the oldest version allowed, with the reason (CVE ids) it is there. It
covers one major line: a pin on another major (postgres 17.0 is newer than 16.10,
but older than the fixes of the 17 line) needs a floor of its own first. Raise a
floor when a fix matters; an image without a floor fails too. Read from the files:
there is no Docker engine here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Floor:
    version: str
    why: str


# Image (or tool) -> floors, one per major line. Issue 34, item 18.
FLOORS: dict[str, tuple[Floor, ...]] = {
    "postgres": (
        Floor(
            "16.10", "CVE-2025-1094 (fixed in 16.7), CVE-2025-8713, CVE-2025-8714, CVE-2025-8715"
        ),
    ),
    "redis": (
        Floor(
            "7.4.6",
            "CVE-2025-49844 (Lua use-after-free, remote code execution), CVE-2025-46817, "
            "CVE-2025-46818, CVE-2025-46819",
        ),
    ),
    "axllent/mailpit": (Floor("1.27.0", "issue 34, item 18: v1.21 was a year behind"),),
    "python": (Floor("3.11.14", "the base image's patch release when the floors were set"),),
    "uv": (Floor("0.13.9", "the installer's release when the floors were set"),),
}


def version_of(tag: str) -> tuple[int, ...] | None:
    """``16.10``, ``v1.27.0``, ``16.10-bookworm``, ``3.11.14-slim-bookworm`` -> numbers."""
    match = re.fullmatch(r"v?(\d+(?:\.\d+)*)(?:-[\w.-]+)?", tag)
    return tuple(int(part) for part in match[1].split(".")) if match else None


def pins() -> list[tuple[str, str, str]]:
    """(where, image, tag) for every pin: compose's images, the Dockerfile's FROM lines
    and its ``pip install uv==`` line."""
    found = []
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, spec in compose["services"].items():
        if spec.get("build") or "image" not in spec:
            continue  # the project's own image, built from the Dockerfile below
        image, _, tag = spec["image"].split("@")[0].rpartition(":")
        found.append((f"docker-compose.yml service {name}", image, tag))
    dockerfile = (ROOT / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.upper().startswith("FROM "):
            image, _, tag = line.split()[1].split("@")[0].rpartition(":")
            found.append(("Dockerfile FROM", image, tag))
    for tag in re.findall(r"\buv==(\S+)", dockerfile):
        found.append(("Dockerfile pip install", "uv", tag))
    return found


def problem(where: str, image: str, tag: str) -> str | None:
    version = version_of(tag)
    if version is None:
        return f"{where}: {image}:{tag} is not pinned to a version"
    floors = FLOORS.get(image)
    if not floors:
        return f"{where}: {image} has no floor: add one to FLOORS in {Path(__file__).name}"
    line = [floor for floor in floors if version_of(floor.version)[0] == version[0]]
    if not line:
        return (
            f"{where}: {image} {tag} is on a major line with no floor "
            f"(floors: {', '.join(f.version for f in floors)}); add one for {version[0]}.x "
            "with the fixes that line needs"
        )
    floor = line[0]
    if version < version_of(floor.version):
        return (
            f"{where}: {image} is pinned to {tag}, older than its floor {floor.version}, "
            f"which is there for {floor.why}"
        )
    return None


def test_every_image_pin_is_at_least_its_floor():
    found = pins()
    images = {image for _, image, _ in found}
    assert {"postgres", "redis", "axllent/mailpit", "python", "uv"} <= images, found
    problems = [p for p in (problem(*pin) for pin in found) if p]
    assert not problems, "\n".join(problems)


def test_every_floor_belongs_to_a_pin():
    """A floor left behind by a removed image would read as a guarantee it is not."""
    images = {image for _, image, _ in pins()}
    assert set(FLOORS) <= images, set(FLOORS) - images


def test_versions_compare_as_numbers_and_the_message_names_the_reason():
    assert version_of("16.9") < version_of("16.10") == (16, 10)
    assert version_of("v1.27.0") == (1, 27, 0) and version_of("latest") is None
    message = problem("docker-compose.yml service postgres", "postgres", "16.6")
    assert "postgres is pinned to 16.6, older than its floor 16.10" in message
    assert "CVE-2025-1094" in message and "CVE-2025-8715" in message
    assert "no floor" in problem("x", "postgres", "17.0")
    assert problem("x", "postgres", "16.10-bookworm") is None
