"""The devnet as `chainstate up` runs it: anvil on the data dir's state file, brought back to
the write nodes' head before it starts, and started again the same way when it dies while the
stack runs (killed, out of memory), with the write nodes paused meanwhile.

Before each start: a left-over anvil of a crashed run is waited for and its last dump taken
when complete, the state file is made to hold the highest write-node store's head, and a write
node behind it gets the blocks anvil can no longer replay (nodes/devnet/recovery.py). Each
step that did something is one line through `say`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from nodes.devnet.anvil import AnvilProcess
from nodes.devnet.recovery import catch_up_writers, restore_chain

log = logging.getLogger(__name__)

WATCH_INTERVAL = 0.25  # seconds between checks that anvil still runs
RETRY_PAUSE = 5.0  # seconds before another try when anvil could not be started again


class Pausable(Protocol):
    """A write node following the devnet's anvil (nodes/writer/service.py)."""

    async def pause(self) -> None: ...

    def resume(self) -> None: ...


class Devnet:
    """anvil and the recovery steps around its starts; `supervise` restarts it when it dies."""

    def __init__(
        self, anvil: AnvilProcess, stores: Sequence[tuple[str, Path]], say: Callable[[str], None]
    ) -> None:
        self.anvil = anvil
        self.stores = list(stores)  # (write node key, its store file)
        self.say = say
        self.restarts = 0
        self._writers: list[Pausable] = []
        self._watch: asyncio.Task[None] | None = None

    def recover(self) -> list[str]:
        """The recovery steps before a start (blocking); what each step did."""
        state_path = self.anvil.state_path
        lines = [self.anvil.settle_previous()]
        if state_path is not None:
            lines.append(restore_chain(state_path, self.stores))
            lines.extend(catch_up_writers(state_path, self.stores))
        return [line for line in lines if line]

    async def start(self) -> None:
        for line in await asyncio.to_thread(self.recover):
            self.say(line)
        self.say(f"starting anvil (chain id {self.anvil.chain_id})…")
        await self.anvil.start()

    def supervise(self, writers: Sequence[Pausable]) -> None:
        """From now on, an anvil that exits on its own is restored and started again, with
        `writers` paused until it answers (they must not store a block meanwhile: the
        restored chain is made from their stores)."""
        self._writers = list(writers)
        self._watch = asyncio.create_task(self._run(), name="devnet watch")

    async def stop_watching(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None

    async def stop(self) -> None:
        await self.stop_watching()
        await self.anvil.stop()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            code = self.anvil.exit_code
            if code is None:
                continue
            how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit code {code}"
            self.say(f"anvil exited on its own ({how}): restoring it and starting it again")
            while True:
                if await self._restart():
                    break
                await asyncio.sleep(RETRY_PAUSE)

    async def _restart(self) -> bool:
        """Pause the writers, restore and start anvil, resume them; False when anvil could
        not be started (said, and tried again later)."""
        for writer in self._writers:
            await writer.pause()
        try:
            await self.anvil.stop()  # the dead process's pid file and output
            await self.start()
        except Exception as exc:
            self.say(f"anvil could not be started again: {exc}; trying again in {RETRY_PAUSE:g} s")
            log.exception("devnet: anvil could not be started again")
            return False
        finally:
            for writer in self._writers:
                writer.resume()
        self.restarts += 1
        self.say("anvil runs again")
        return True


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
