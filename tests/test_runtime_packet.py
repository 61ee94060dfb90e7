"""The docs cannot drift: every module, function, test and file they name exists, and
every default and time bound they quote is the one the code computes.

Checked: docs/runtime_packet.md, docs/operations.md, docs/faults.md, docs/staff.md,
docs/scaling.md, docs/benchmarks.md and README.md.
"""

import importlib
import os
import re
from dataclasses import asdict
from pathlib import Path

from django.conf import settings

from config.timing import TimeBounds

ROOT = Path(__file__).resolve().parents[1]
PACKET = ROOT / "docs" / "runtime_packet.md"
OPERATIONS = ROOT / "docs" / "operations.md"
FAULTS = ROOT / "docs" / "faults.md"
README = ROOT / "README.md"
STAFF = ROOT / "docs" / "staff.md"
SCALING = ROOT / "docs" / "scaling.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
DOCS = {
    "packet": PACKET,
    "operations": OPERATIONS,
    "faults": FAULTS,
    "readme": README,
    "staff": STAFF,
    "scaling": SCALING,
    "benchmarks": BENCHMARKS,
}
OWN_PACKAGES = {"clock", "config", "delivery", "intake", "loopback", "reminders", "workshops"}

# The least each doc must name, so a check that finds nothing cannot pass unnoticed:
# (code references, test references).
AT_LEAST = {
    "packet": (40, 17),  # one test per row of its ownership table; the rest are in faults.md
    "operations": (5, 2),
    "faults": (0, 180),
    "readme": (0, 0),  # its defaults are checked instead (at least 20)
    "staff": (1, 0),
    "scaling": (1, 1),
    "benchmarks": (3, 0),
}

TEST_REF = re.compile(r"^(tests/[\w/]+\.py)::(test_\w+)$")
CODE_REF = re.compile(r"^([a-z_][a-z0-9_]*)((?:\.[A-Za-z_][A-Za-z0-9_]*)+)$")
# "`reminders.services.watch.REVOCATION_WINDOW` (1 s)": a named constant and the figure quoted for it.
QUOTED_CONSTANT = re.compile(r"`([a-z_][\w.]*\.[A-Z][A-Z0-9_]*)`\s+\((\d+(?:\.\d+)?) s\)")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

# Defaults the tests or the Makefile's test recipe set, or that depend on the host.
NOT_DEFAULTS_HERE = {
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "SECRET_KEY",
    "DEBUG",
    "ALLOWED_HOSTS",
    "REMINDERS_CHANNEL",
}
# The time bounds quoted in docs/operations.md are those of the default settings.
DEFAULT_BOUNDS = TimeBounds.derive(budget=120, call_timeout=15)


def _text(doc: str) -> str:
    return DOCS[doc].read_text()


def _references(doc: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", _text(doc))


def _code_references(doc: str) -> list[str]:
    refs = []
    for ref in _references(doc):
        match = CODE_REF.match(ref)
        if match and match.group(1) in OWN_PACKAGES:
            refs.append(ref)
    return sorted(set(refs))


def _test_references(doc: str) -> list[str]:
    return sorted({ref for ref in _references(doc) if TEST_REF.match(ref)})


def _file_references(doc: str) -> list[str]:
    """Return the backticked paths into this repository.

    Left out: URLs (``://``), absolute host paths and URL paths (``/...``),
    paths outside the repository (``../``), ``var/`` and ``mutants/``, which the local run
    and mutmut create, and what no path looks like: a rate (``600/minute``), a media
    type (``application/problem+json``), a pattern (``api:<name>/<label>``).
    """
    return sorted(
        {
            ref
            for ref in _references(doc)
            if "/" in ref
            and "::" not in ref
            and "://" not in ref
            and " " not in ref
            and not ref.startswith(("/", "../", "var/", "mutants/"))
            and re.fullmatch(r"[A-Za-z_.][\w.\-/]*", ref)
        }
    )


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


def _all(collect) -> list[tuple[str, str]]:
    return [(doc, ref) for doc in DOCS for ref in collect(doc)]


def _listed(broken: list[str], kind: str) -> str:
    return f"{len(broken)} {kind} named in the docs do not exist:\n" + "\n".join(broken)


def test_each_doc_names_enough_code_and_tests_to_be_checked():
    short = []
    for doc, (least_code, least_tests) in AT_LEAST.items():
        code, tests = len(_code_references(doc)), len(_test_references(doc))
        if code < least_code or tests < least_tests:
            short.append(f"{DOCS[doc].name}: {code} code (least {least_code}), {tests} tests "
                         f"(least {least_tests})")  # fmt: skip
    assert short == [], "a reference check that finds nothing passes unnoticed:\n" + "\n".join(
        short
    )


def test_every_named_module_and_function_exists():
    broken = []
    for doc, ref in _all(_code_references):
        try:
            _resolve(ref)
        except (ImportError, AttributeError) as exc:
            broken.append(f"{DOCS[doc].name}: `{ref}` ({type(exc).__name__}: {exc})")
    assert broken == [], _listed(broken, "modules, functions or constants")


def test_every_named_test_exists():
    broken = []
    for doc, ref in _all(_test_references):
        path, name = TEST_REF.match(ref).groups()
        source = ROOT / path
        if not source.exists() or not re.search(
            rf"^def {name}\(", source.read_text(), re.MULTILINE
        ):
            broken.append(f"{DOCS[doc].name}: `{ref}`")
    assert broken == [], _listed(broken, "tests")


def test_every_named_file_exists():
    broken = [
        f"{DOCS[doc].name}: `{ref}`"
        for doc, ref in _all(_file_references)
        if not (ROOT / ref).exists()
    ]
    assert broken == [], _listed(broken, "files")


def test_packet_has_no_placeholder_and_the_readme_links_every_doc():
    assert "CACHE_CONTRACT" not in _text("packet")
    readme = _text("readme")
    for doc in ("docs/runtime_packet.md", "docs/operations.md", "docs/faults.md"):
        assert doc in readme


# --- Quoted figures ------------------------------------------------------------------


def _tables(text: str) -> list[list[list[str]]]:
    """Return every Markdown table of ``text`` as rows of stripped cells, header first."""
    tables, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            if not re.fullmatch(r"\|[\s|:-]+\|?", line.strip()):  # not the separator
                current.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables


def _set_by_the_test_run() -> set[str]:
    """Return the variables this process does not see at their default."""
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    return NOT_DEFAULTS_HERE | set(re.findall(r"\b([A-Z][A-Z0-9_]+)=", recipe)) | set(os.environ)


def _derived_defaults() -> dict[str, object]:
    """Defaults quoted for variables that are not Django settings of the same name."""
    return {
        "REMINDERS_VISIBILITY_TIMEOUT": settings.REMINDERS_TIME_BOUNDS.visibility_timeout,
        "DB_CONN_MAX_AGE": settings.DATABASES["default"]["CONN_MAX_AGE"],
    }


def _quoted_defaults(doc: str) -> list[tuple[str, str]]:
    """Return (variable, literal) for each default quoted as one backticked literal.

    Read from every table whose first two headers are a variable or setting and
    "default". A row naming several variables pairs them with the default cell's
    comma-separated parts, in order; a row whose parts do not pair up is skipped.
    """
    quoted = []
    for table in _tables(_text(doc)):
        header = [cell.lower() for cell in table[0][:2]]
        if len(header) < 2 or header[0] not in {"variable", "setting"} or header[1] != "default":
            continue
        for row in table[1:]:
            names = re.findall(r"`([A-Z][A-Z0-9_]+)`", row[0])
            parts = [row[1]] if len(names) == 1 else [p.strip() for p in row[1].split(",")]
            if len(parts) != len(names):
                continue
            for name, part in zip(names, parts, strict=True):
                literals = re.findall(r"`([^`]+)`", part)
                if len(literals) == 1:
                    quoted.append((name, literals[0]))
    return quoted


def _checked_defaults(doc: str) -> list[tuple[str, str, object]]:
    skip, derived = _set_by_the_test_run(), _derived_defaults()
    checked = []
    for name, literal in _quoted_defaults(doc):
        if name in skip:
            continue
        if name in derived:
            checked.append((name, literal, derived[name]))
        elif hasattr(settings, name):
            value = getattr(settings, name)
            if isinstance(value, int | float | str) and not isinstance(value, bool):
                checked.append((name, literal, value))
    return checked


def _equal(literal: str, value: object) -> bool:
    if NUMBER.fullmatch(literal):
        return not isinstance(value, str) and float(literal) == float(value)
    return literal == value


def test_every_quoted_default_is_the_effective_default():
    wrong = []
    for doc, least in (("readme", 20), ("operations", 15)):
        checked = _checked_defaults(doc)
        if len(checked) < least:
            wrong.append(f"{DOCS[doc].name}: only {len(checked)} defaults found (least {least})")
        wrong += [
            f"{DOCS[doc].name}: {name}: the doc says {literal!r}, the default is {value!r}"
            for name, literal, value in checked
            if not _equal(literal, value)
        ]
    assert wrong == [], "\n".join(wrong)


def _quoted_bounds() -> dict[str, float]:
    """Return the "bound | seconds" table of docs/operations.md as {field: seconds}."""
    for table in _tables(_text("operations")):
        if [cell.lower() for cell in table[0][:2]] == ["bound", "seconds"]:
            rows = {}
            for row in table[1:]:
                name = re.fullmatch(r"`(\w+)`", row[0])
                assert name and NUMBER.fullmatch(row[1]), f"unreadable row {row}"
                rows[name.group(1)] = float(row[1])
            return rows
    raise AssertionError("docs/operations.md has no table headed 'bound | seconds'")


def test_the_time_bounds_quoted_in_operations_are_the_derived_ones():
    assert _quoted_bounds() == asdict(DEFAULT_BOUNDS)
    # ... and those are the bounds this process runs with, when nothing overrides them.
    inputs = {"REMINDERS_BATCH_BUDGET", "REMINDERS_CALL_TIMEOUT", "REMINDERS_VISIBILITY_TIMEOUT"}
    if not inputs & _set_by_the_test_run():
        assert settings.REMINDERS_TIME_BOUNDS == DEFAULT_BOUNDS


def test_every_constant_quoted_with_its_figure_has_that_value():
    quoted = [
        (doc, name, figure)
        for doc in DOCS
        for name, figure in QUOTED_CONSTANT.findall(_text(doc))
        if name.split(".", 1)[0] in OWN_PACKAGES
    ]
    assert quoted, "no `module.CONSTANT` (N s) figure found"
    wrong = [
        f"{DOCS[doc].name}: {name} is {_resolve(name)!r}, quoted as {figure} s"
        for doc, name, figure in quoted
        if float(figure) != float(_resolve(name))
    ]
    assert wrong == []


def test_the_prune_batches_quoted_in_operations_are_the_codes():
    from reminders.services.dispatch import PRUNE_BATCH, PRUNE_PER_SCAN

    quoted = f"at most {PRUNE_BATCH:,} rows a transaction and {PRUNE_PER_SCAN:,} a scan"
    assert quoted in " ".join(_text("operations").split())


def test_the_packet_and_the_readme_stay_within_their_caps():
    """Issue 33: a maintainer reads the packet in one sitting, an operator the README."""
    words = len(PACKET.read_text().split())
    lines = len(README.read_text().splitlines())
    assert words <= 4_000, f"docs/runtime_packet.md has {words} words; link to detail instead"
    assert lines <= 250, f"README.md has {lines} lines; move detail to docs/"
