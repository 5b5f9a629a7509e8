"""The count of documentation code blocks found and run, at the end of the session."""

from __future__ import annotations

from docs.snippets import RAN, REPORT


def pytest_terminal_summary(terminalreporter):
    if not (REPORT or RAN):
        return
    terminalreporter.write_sep("-", "documentation code blocks")
    if RAN:
        terminalreporter.write_line(f"{sum(RAN.values())} blocks run on {len(RAN)} pages: {RAN}")
    for line in REPORT:
        terminalreporter.write_line(line)
