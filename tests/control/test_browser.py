"""The dashboard in a real headless browser (Debian's chromium, started here; the test fails, never skips,
if it cannot start): the page of a running job draws that job's checkpoints, its graph and its buttons;
a screenshot is saved under the test's tmp dir."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow as pa
from sluice import CheckpointConfig, Pipeline
from sluice.connectors.generator import GeneratorSource
from sluice.control.client import ControlClient
from sluice.sinks.testing import TwoPhaseCommitTestSink

from tests.control.browser import Page, chromium
from tests.control.conftest import wait_for

CHECKPOINT_IDS = "[...document.querySelectorAll('#plot-duration g[data-checkpoint]')].map(g => +g.dataset.checkpoint)"


def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(0.003)
    return batch


def test_the_dashboard_plots_the_running_jobs_checkpoints(tmp_path: Path) -> None:
    p = Pipeline("dashboard", parallelism=2, checkpoint=CheckpointConfig(interval=0.3, storage=str(tmp_path / "chk")))
    src = GeneratorSource(num_splits=2, records_per_split=10**7, batch_size=50, rows_per_second=8000)
    p.source(src, name="orders").rebalance().map_batches(slow, name="enrich").sink(
        TwoPhaseCommitTestSink(str(tmp_path / "out")), name="parquet"
    )
    client = p.start(runtime="local", restore="none")
    try:
        api = ControlClient(client.control.url, Path(client.control.token_file).read_text())
        wait_for("three checkpoints", lambda: api.get("/api/v1/job")["checkpoint_counts"]["completed"] >= 3)

        async def look(devtools_port: int) -> tuple[list[int], list[int], str, list[str]]:
            async with Page(devtools_port) as page:
                await page.call("Page.enable")
                await page.call("Page.navigate", url=api.login_url)
                await page.wait_for("document.body.dataset.loaded === '1' && location.search === ''")
                # wait until the plots show at least the checkpoints that had completed before
                known = [c["checkpoint_id"] for c in api.get("/api/v1/checkpoints")["history"] if c["status"] == "completed"]
                shown = await page.wait_for(
                    f"(ids => {known}.every(k => ids.includes(k)) && ids)({CHECKPOINT_IDS})", timeout=90
                )
                sizes = await page.evaluate(
                    "[...document.querySelectorAll('#plot-size g[data-checkpoint]')].map(g => +g.dataset.checkpoint)"
                )
                header = await page.evaluate("document.getElementById('job-id').textContent + ' ' + "
                                             "document.getElementById('status').textContent")
                vertices = await page.evaluate(
                    "[...document.querySelectorAll('#graph g.vertex title')].map(t => t.textContent)"
                )
                await page.screenshot(tmp_path / "dashboard.png")
                return shown, sizes, header, vertices

        with chromium(tmp_path) as port:
            shown, sizes, header, vertices = asyncio.run(look(port))
        assert set(shown) <= {c["checkpoint_id"] for c in api.get("/api/v1/checkpoints")["history"]}
        assert len(shown) >= 3 and sizes == shown  # every plot shows the same checkpoints of this job
        assert header == "dashboard running"
        assert vertices == ["orders", "rebalance -> enrich -> parquet"]
        png = (tmp_path / "dashboard.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    finally:
        client.cancel()
