"""A rule's shell appends to its log (issue 23: a second Snakemake run on one results folder, refused by the
capture's lock, truncated the running first run's logs/capture.log with its `> {log}`)."""

from __future__ import annotations

import re

from tests.conftest import REPO


def test_every_rule_appends_to_its_log_and_never_truncates_it():
    redirections = []
    for smk in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for found in re.finditer(r"(>+)\s*\{log(?::q)?\}", smk.read_text()):
            redirections.append((smk.name, found.group(1)))
    assert len(redirections) >= 10, redirections  # every stage's rule writes its log
    assert [r for r in redirections if r[1] != ">>"] == []
