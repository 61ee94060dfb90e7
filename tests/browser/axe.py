"""axe-core, the accessibility engine, run in the page a test has open.

axe.min.js comes inside the axe-playwright-python package (a dev dependency): nothing is
fetched at run time. The WCAG 2.0 and 2.1 level A and AA rules run, and with them the few
best-practice rules that say what a page is built of: one main landmark, all its content
inside landmarks, a first-level heading, headings in order.
"""

from __future__ import annotations

from axe_playwright_python.base import AXE_SCRIPT

WCAG_21_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
BEST_PRACTICE = ["landmark-one-main", "region", "page-has-heading-one", "heading-order"]


# A node that matches ``ignore[rule]`` (a CSS selector) is no violation of that rule.
RUN = """async ([options, ignore]) => {
    const {violations} = await axe.run(document, options);
    const kept = (rule, node) => !(rule in ignore)
        || !document.querySelector(node.target[0]).matches(ignore[rule]);
    return violations
        .map(rule => ({...rule, nodes: rule.nodes.filter(node => kept(rule.id, node))}))
        .filter(rule => rule.nodes.length);
}"""


def axe_violations(
    page, *, ignore: dict[str, str] | None = None, page_rules: bool = True
) -> list[dict]:
    """Return axe's violations on ``page`` as it is now.

    ``page_rules=False`` leaves out the best-practice rules of what a page is built of (a
    message's HTML part has no landmarks: the mail reader's own page holds it).

    ``ignore`` maps a rule id to a CSS selector of the nodes it does not count: only for
    Django's own admin chrome, which the project does not restyle; each caller says why.
    Frames are not entered: a sandboxed frame runs no script, so axe would only wait for it
    to answer (the frame's title is still checked, from the page).
    """
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(AXE_SCRIPT)
    options = {
        "runOnly": {"type": "tag", "values": WCAG_21_AA},
        "rules": {rule: {"enabled": page_rules} for rule in BEST_PRACTICE},
        "resultTypes": ["violations"],
        "iframes": False,
    }
    return page.evaluate(RUN, [options, ignore or {}])


def describe(violations: list[dict]) -> str:
    """One line per rule: its id, impact, how many nodes, and the first few of them."""
    lines = []
    for rule in violations:
        targets = ", ".join(" ".join(map(str, node["target"])) for node in rule["nodes"][:4])
        lines.append(f"{rule['id']} ({rule['impact']}) x{len(rule['nodes'])}: {targets}")
    return "\n".join(lines)


def assert_no_violations(found: dict[str, list[dict]]) -> None:
    """``found`` maps each page visited to its violations: all must be empty."""
    bad = {name: violations for name, violations in found.items() if violations}
    assert not bad, "axe-core found WCAG 2.1 A/AA violations:\n" + "\n".join(
        f"[{name}]\n{describe(violations)}" for name, violations in bad.items()
    )
