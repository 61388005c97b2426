"""The local API's stall evidence: a request open too long gets every task's await chain and every thread."""

from __future__ import annotations

import asyncio
import logging
import time

from services.api_watch import DUMP_AFTER_S, watch_open_requests


async def _held(event: asyncio.Event) -> None:
    await event.wait()  # the line a dump must show


def test_a_request_open_too_long_is_dumped_once(caplog):
    async def main() -> None:
        event = asyncio.Event()
        holder = asyncio.create_task(_held(event), name="holder")
        open_requests = {1: ("POST /api/flow_runs/x/set_state", time.monotonic() - DUMP_AFTER_S - 1)}
        watcher = asyncio.create_task(watch_open_requests(open_requests, 0.0, logging.getLogger("t")))
        await asyncio.sleep(2.5)  # two polls: one dump
        watcher.cancel()
        event.set()
        await holder

    with caplog.at_level(logging.WARNING, logger="t"):
        asyncio.run(main())
    dumps = [r.getMessage() for r in caplog.records if "request open" in r.getMessage()]
    assert len(dumps) == 1
    assert "POST /api/flow_runs/x/set_state" in dumps[0]
    assert "task holder:" in dumps[0]
    assert "in _held" in dumps[0]
    assert "awaits <Future" in dumps[0] or "awaits" in dumps[0]
    assert "thread MainThread:" in dumps[0]
