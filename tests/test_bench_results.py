"""Figures quoted in the docs come from the stamped results files under bench/results/.

A benchmark run with ``--save`` writes ``bench/results/NAME.json``: its
figures with the commit and date they were measured at. A doc quotes one as
``186.5<!-- result e2e-http product.rate -->/s`` (the comment is invisible
once rendered) and names the run as ``at 1a2b3c4 on 2026-12-01<!-- stamp
e2e-http -->``. This test fails when a quoted figure or stamp no longer
matches its file, so a re-run that changes a figure forces the docs to follow.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FIGURE = re.compile(r"(-?\d[\d,]*(?:\.\d+)?)<!-- result (\S+) (\S+) -->")
STAMP = re.compile(r"at (\w+) on (\d{4}-\d{2}-\d{2})<!-- stamp (\S+) -->")
MARKER = re.compile(r"<!-- (result|stamp) ")


def _results() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))}


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
        except (KeyError, TypeError):
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
    return problems, len(figures)


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


def test_every_figure_the_docs_quote_is_the_one_in_its_results_file():
    results = _results()
    quoted, problems = 0, []
    for doc in DOCS:
        found, count = problems_in(doc.name, doc.read_text(), results)
        problems += found
        quoted += count
    assert problems == []
    assert quoted, "no doc quotes a results file"


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
    ):
        found, _ = problems_in("doc", bad, results)
        assert len(found) == 1, (bad, found)
