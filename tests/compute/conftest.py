"""Compute fixtures: one isolation probe per session, a shared Go build cache."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from workspace.compute.runners import CodeRunner, RunnerSettings
from workspace.compute.sandbox import (
    Isolation,
    Limits,
    Sandbox,
    UidPool,
    WorkerPool,
    probe_isolation,
    release_isolation,
)

REPO = Path(__file__).resolve().parents[2]
# Kept between sessions (gitignored) so the first Go build of the standard library is paid once.
GO_CACHE = REPO / ".chainstate" / "test-compute-cache"

FAST = Limits(wall_seconds=5, cpu_seconds=5, memory_bytes=256 * 1024 * 1024)


@pytest.fixture(scope="session")
def isolation() -> Iterator[Isolation]:
    iso = probe_isolation()
    yield iso
    release_isolation(iso)


@pytest.fixture
def sandbox(isolation: Isolation) -> Iterator[Sandbox]:
    # Not under pytest's tmp_path: that is 0700 and the runs' own uids must reach their folder.
    root = Path(tempfile.mkdtemp(prefix="cs-compute-"))
    root.chmod(0o711)
    yield Sandbox(isolation, work_root=root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pool() -> WorkerPool:
    return WorkerPool(workers=2, max_queue=8, uids=UidPool(2_100_000, 4))


@pytest.fixture
async def runner(sandbox: Sandbox, pool: WorkerPool) -> AsyncIterator[CodeRunner]:
    r = CodeRunner(sandbox, pool, RunnerSettings(limits=FAST, cache_dir=GO_CACHE))
    await r.prepare()
    yield r
