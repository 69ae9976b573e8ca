"""Shared test set-up: markers' bookkeeping and the fault-injection scenario counter."""

from __future__ import annotations

import logging

import pytest

from tests.faults.shapes import SCENARIO_LOG


def pytest_configure(config: pytest.Config) -> None:
    logging.getLogger("sluice").setLevel(logging.ERROR)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SCENARIO_LOG:
        fired = sum(1 for s in SCENARIO_LOG if s["fired"])
        crashes = sum(s["fired"] for s in SCENARIO_LOG)
        terminalreporter.write_sep("=", "fault injection")
        terminalreporter.write_line(
            f"{len(SCENARIO_LOG)} randomized scenarios ran; {fired} had injected crashes "
            f"({crashes} crashes in total); every committed output was compared with a failure-free run"
        )
