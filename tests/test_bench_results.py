"""Figures quoted in the docs come from the stamped results files under bench/results/.

A benchmark run with ``--save`` writes ``bench/results/NAME-<commit>.json``
(``bench.harness.save_results``): its figures with the commit and date they
were measured at. The file never changes afterwards: a save from a tree that
differs from its commit, or over an existing file, is refused, and a re-run
at a later commit writes a file of its own. A doc quotes a figure as
``186.5<!-- result e2e-http-1a2b3c4 product.rate -->/s`` (the comment is
invisible once rendered) and names the run as ``at 1a2b3c4 on
2026-12-01<!-- stamp e2e-http-1a2b3c4 -->``. These tests fail when a quoted
figure or stamp does not match its file, when a file a doc names is missing,
when a file's name does not end in the commit it records, and when a
committed file was changed after it was added (more than one commit touches
it, or its working copy differs from the committed one).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench.harness import results_path, save_results, saveable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BENCHMARKS_MD_LINES = 200
FIGURE = re.compile(r"(-?\d[\d,]*(?:\.\d+)?)<!-- result (\S+) (\S+) -->")
STAMP = re.compile(r"at (\w+) on (\d{4}-\d{2}-\d{2})<!-- stamp (\S+) -->")
MARKER = re.compile(r"<!-- (result|stamp) ")
# A stamped results file named in prose, e.g. `bench/results/e2e-http-1a2b3c4.json`.
NAMED = re.compile(r"bench/results/([\w.-]+-[0-9a-f]{7,40})\.json")


def _results() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))}


def _git(*argv: str) -> str:
    return subprocess.run(
        ["git", *argv], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout


def _lookup(document: dict, dotted: str):
    value = document
    for part in dotted.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def problems_in(name: str, text: str, results: dict[str, dict]) -> tuple[list[str], int]:
    """Return what in ``text`` disagrees with ``results``, and how many figures it quotes."""
    problems = []
    figures = FIGURE.findall(text)
    stamps = STAMP.findall(text)
    if len(MARKER.findall(text)) != len(figures) + len(stamps):
        problems.append(f"{name}: a result or stamp marker is not right after its figure or stamp")
    for shown, result, dotted in figures:
        if result not in results:
            problems.append(f"{name} quotes bench/results/{result}.json, which is missing")
            continue
        try:
            value = _lookup(results[result], dotted)
        except (KeyError, TypeError, IndexError):
            problems.append(f"{name} quotes {result} {dotted}, which the file does not hold")
            continue
        decimals = len(shown.partition(".")[2])
        if round(float(value), decimals) != float(shown.replace(",", "")):
            problems.append(f"{name}: {result} {dotted} is {value}, the doc says {shown}")
    for commit, date, result in stamps:
        if result not in results:
            problems.append(f"{name} names bench/results/{result}.json, which is missing")
        elif (commit, date) != (results[result]["commit"], results[result]["date"]):
            stamp = (results[result]["commit"], results[result]["date"])
            problems.append(f"{name}: {result} is stamped {stamp}, the doc says {(commit, date)}")
    for result in NAMED.findall(text):
        if result not in results:
            problems.append(f"{name} names bench/results/{result}.json, which is missing")
    return problems, len(figures)


def misnamed(results: dict[str, dict]) -> list[str]:
    """Return each results file whose name does not end in the commit its figures record."""
    return [
        f"bench/results/{name}.json records commit {document['commit']}, "
        f"so its name must end in -{document['commit']}"
        for name, document in results.items()
        if not name.endswith(f"-{document['commit']}")
    ]


def rewritten(history: dict[str, list[str]], edited: set[str]) -> list[str]:
    """Return each committed results file that changed after it was added.

    ``history`` holds, per file name, the commits touching it (``git log``, newest
    first; none while it is not committed yet); ``edited``, the names whose working
    copy differs from the committed one.
    """
    problems = []
    for name, commits in history.items():
        if len(commits) > 1:
            problems.append(
                f"bench/results/{name}.json was changed after it was added: "
                f"{len(commits)} commits touch it ({', '.join(c[:7] for c in commits)}); "
                "a re-run saves a file of its own, named for its commit"
            )
        if commits and name in edited:
            problems.append(
                f"bench/results/{name}.json differs from its committed copy; a results "
                "file never changes, a re-run saves a file of its own"
            )
    return problems


def test_every_results_file_is_stamped_with_a_commit_of_this_history_and_a_date():
    results = _results()
    assert results, "no results file under bench/results"
    for name, document in results.items():
        assert {"bench", "commit", "date", "tree", "settings"} <= set(document), name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", document["date"]), name
        known = subprocess.run(
            ["git", "cat-file", "-e", f"{document['commit']}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        assert known.returncode == 0, f"{name}: commit {document['commit']} is not in this history"


def test_every_results_file_is_named_for_the_commit_it_records():
    problems = misnamed(_results())
    assert not problems, "\n".join(problems)


def test_no_results_file_changed_after_it_was_added():
    history = {
        path.stem: _git("log", "--format=%H", "--", str(path.relative_to(ROOT))).split()
        for path in sorted(RESULTS.glob("*.json"))
    }
    edited = {
        Path(line).stem
        for line in _git("diff", "--name-only", "HEAD", "--", "bench/results/").splitlines()
    }
    problems = rewritten(history, edited)
    assert not problems, "\n".join(problems)


def test_every_figure_the_docs_quote_is_the_one_in_its_results_file():
    results = _results()
    quoted, problems = 0, []
    for doc in DOCS:
        found, count = problems_in(doc.name, doc.read_text(), results)
        problems += found
        quoted += count
    assert not problems, "\n".join(problems)
    assert quoted, "no doc quotes a results file"


def test_benchmarks_md_stays_within_its_cap():
    lines = len((ROOT / "docs" / "benchmarks.md").read_text().splitlines())
    assert lines <= BENCHMARKS_MD_LINES, (
        f"docs/benchmarks.md has {lines} lines (cap {BENCHMARKS_MD_LINES}): how figures moved "
        "belongs in commit messages"
    )


def test_a_drifted_figure_a_wrong_stamp_and_a_stray_marker_are_each_caught():
    results = {"e2e-x": {"commit": "abc1234", "date": "2026-12-01", "product": {"rate": 186.5}}}
    good = "186.5<!-- result e2e-x product.rate -->/s, at abc1234 on 2026-12-01<!-- stamp e2e-x -->"
    assert problems_in("doc", good, results) == ([], 1)
    for bad in (
        "186.4<!-- result e2e-x product.rate -->/s",
        "186.5<!-- result e2e-x product.cpu -->",
        "186.5<!-- result e2e-y product.rate -->",
        "at abc1234 on 2026-11-30<!-- stamp e2e-x -->",
        "186.5 <!-- result e2e-x product.rate -->",
        "in `bench/results/e2e-x-abc1234.json`",
    ):
        found, _ = problems_in("doc", bad, results)
        assert len(found) == 1, (bad, found)


def test_a_misnamed_file_and_a_rewritten_one_are_each_caught():
    assert misnamed({"e2e-x-abc1234": {"commit": "abc1234"}}) == []
    assert len(misnamed({"e2e-x": {"commit": "abc1234"}})) == 1
    assert len(misnamed({"e2e-x-abc1234": {"commit": "def5678"}})) == 1
    assert rewritten({"new": [], "kept": ["c1"]}, edited={"new"}) == []
    assert len(rewritten({"kept": ["c2", "c1"]}, edited=set())) == 1
    assert len(rewritten({"kept": ["c1"]}, edited={"kept"})) == 1


CLEAN = {"commit": "abc1234", "tree": "clean", "date": "2026-12-01"}


@pytest.fixture
def results_dir(tmp_path):
    directory = tmp_path / "bench" / "results"
    directory.mkdir(parents=True)
    return directory


def test_a_save_writes_a_file_named_for_its_commit_once(results_dir):
    started = saveable("e2e-x", now=CLEAN, directory=results_dir)
    figures = {"bench": "e2e", **started, "product": {"rate": 186.5}}
    saved = save_results("e2e-x", figures, now=CLEAN, directory=results_dir)
    assert saved == Path("bench/results/e2e-x-abc1234.json")
    assert json.loads(results_path("e2e-x", "abc1234", results_dir).read_text()) == figures
    with pytest.raises(SystemExit, match="never changes once written"):
        saveable("e2e-x", now=CLEAN, directory=results_dir)
    with pytest.raises(SystemExit, match="never changes once written"):
        save_results("e2e-x", {**figures, "product": {}}, now=CLEAN, directory=results_dir)
    assert json.loads(results_path("e2e-x", "abc1234", results_dir).read_text()) == figures


def test_a_save_from_a_changed_tree_or_across_a_commit_is_refused(results_dir):
    with pytest.raises(SystemExit, match="the tree differs from HEAD"):
        saveable("e2e-x", now={**CLEAN, "tree": "modified"}, directory=results_dir)
    figures = {"bench": "e2e", **CLEAN}
    with pytest.raises(SystemExit, match="the tree differs from HEAD"):
        save_results("e2e-x", figures, now={**CLEAN, "tree": "modified"}, directory=results_dir)
    with pytest.raises(SystemExit, match="HEAD moved from abc1234 to def5678"):
        save_results("e2e-x", figures, now={**CLEAN, "commit": "def5678"}, directory=results_dir)
    with pytest.raises(SystemExit, match="no git commit"):
        saveable("e2e-x", now={**CLEAN, "commit": "unknown"}, directory=results_dir)
    assert list(results_dir.iterdir()) == []
