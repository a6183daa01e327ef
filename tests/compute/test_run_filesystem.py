"""A run's files: the machine read-only, private temp folders, a write budget, nothing left
behind for the next run (files, SysV IPC), and a sandbox uid cleaned before it is reused.
Each case runs with bubblewrap and with the root fallback (`private_sandbox`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from workspace.compute.sandbox import Job, Limits, Sandbox, UidPool, probe_isolation
from workspace.compute.sandbox.probe import PROBE_UID
from workspace.compute.sandbox.rundirs import (
    PROBE_SLOT,
    create_run_dirs,
    remove_leftover_run_dirs,
    remove_run_dirs,
)
from workspace.compute.sandbox.uids import remove_uid_files

PY = "/usr/bin/python3"
UID = 2_100_030


def job(code: str, **limits: object) -> Job:
    return Job([PY, "-I", "-c", code], limits=Limits(**{"wall_seconds": 10, **limits}))


# tries to create a file in each folder; prints {folder: "ok" | error name}
TRY_WRITES = """import json, os, sys
out = {}
for folder in json.loads(sys.argv[1]):
    path = os.path.join(folder, "cs-probe-" + sys.argv[2])
    try:
        with open(path, "w") as fh:
            fh.write("x")
        out[folder] = "ok"
    except OSError as exc:
        out[folder] = type(exc).__name__
print(json.dumps(out))
"""
PRIVATE = ["/tmp", "/var/tmp", "/run/lock", "/dev/shm", "."]


async def try_writes(sandbox: Sandbox, folders: list[str], marker: str) -> dict[str, str]:
    argv = [PY, "-I", "-c", TRY_WRITES, json.dumps(folders), marker]
    res = await sandbox.run(Job(argv, limits=Limits(wall_seconds=10)), uid=UID)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


async def test_the_machine_is_read_only_and_temp_folders_private(
    private_sandbox: Sandbox,
) -> None:
    marker = uuid.uuid4().hex
    work_root = private_sandbox.work_root
    host = ["/", "/etc", "/usr/local", "/var", "/root", "/var/lib"]
    checkout = str(Path.cwd())
    if not checkout.startswith(("/tmp/", "/var/tmp/")):  # else it lies in the run's own /tmp
        host.append(checkout)
    got = await try_writes(private_sandbox, [*host, *PRIVATE, str(work_root)], marker)
    # read-only file system (OSError EROFS) or no permission: never written
    assert all(got[f] in ("OSError", "PermissionError") for f in host), got
    assert {f: got[f] for f in PRIVATE} == dict.fromkeys(PRIVATE, "ok")
    # what the run wrote in its temp folders and home went with it, and so did its folder
    folders = ["/tmp", "/var/tmp", "/run/lock", "/dev/shm", str(work_root), checkout]
    assert await asyncio.to_thread(host_files, folders, f"cs-probe-{marker}") == []
    assert await asyncio.to_thread(leftovers, work_root) == []


def leftovers(work_root: Path) -> list[str]:
    """What runs left in the work root: anything but the empty, unmounted folders kept for
    their uids' next runs."""
    return [
        str(path)
        for path in work_root.iterdir()
        if not path.name.startswith("run-") or os.path.ismount(path) or any(path.iterdir())
    ]


def host_files(folders: list[str], name: str) -> list[str]:
    """Which of `folders` hold `name` on the machine (outside any run)."""
    return [f for f in folders if os.path.exists(os.path.join(f, name))]


LEAVE = """import ctypes, os
for folder in ("/tmp", "/var/tmp", "/run/lock", "/dev/shm", os.environ["HOME"]):
    with open(os.path.join(folder, "left-behind"), "w") as fh:
        fh.write("for the next run")
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0x5eed, 4096, 0o1666)  # IPC_CREAT | 0666
print("shm", shm, ctypes.get_errno())
"""
LOOK = """import json, os
found = [f for f in ("/tmp", "/var/tmp", "/run/lock", "/dev/shm", os.environ["HOME"])
         if os.path.exists(os.path.join(f, "left-behind"))]
with open("/proc/sysvipc/shm") as fh:
    segments = fh.read().splitlines()[1:]
print(json.dumps({"files": found, "shm": segments}))
"""


def host_shm_keys() -> set[int]:
    with open("/proc/sysvipc/shm") as fh:
        return {int(line.split()[0]) for line in fh.read().splitlines()[1:]}


async def test_nothing_is_left_for_the_next_run_of_the_uid(private_sandbox: Sandbox) -> None:
    first = await private_sandbox.run(job(LEAVE), uid=UID)
    assert first.exit_code == 0 and b"shm -1" not in first.output, first.output
    assert 0x5EED not in host_shm_keys()  # the segment lived in the run's own IPC namespace
    second = await private_sandbox.run(job(LOOK), uid=UID)
    assert second.exit_code == 0, second.output
    assert json.loads(second.output) == {"files": [], "shm": []}


async def test_the_write_budget_bounds_bytes_and_files(sandbox: Sandbox) -> None:
    if not sandbox.isolation.run_tmpfs:
        pytest.fail(f"no tmpfs per run here: {sandbox.isolation.notes}")
    fill = (
        "import os\n"
        "for i in range(8):\n"
        "    with open(os.path.join('/tmp' if i % 2 else '.', f'f{i}'), 'wb') as fh:\n"
        "        fh.write(b'x' * 512 * 1024)\n"
    )
    res = await sandbox.run(job(fill, write_bytes=2 * 1024 * 1024), uid=UID)
    assert res.exit_code == 1 and b"No space left on device" in res.output, res.output
    many = "for i in range(200):\n    open(f'/tmp/f{i}', 'w').close()\n"
    res = await sandbox.run(job(many, write_files=50), uid=UID)
    assert res.exit_code == 1 and b"No space left on device" in res.output, res.output
    ok = await sandbox.run(job(many, write_files=500), uid=UID)
    assert ok.exit_code == 0, ok.output


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder anyone may write (like /tmp), with a file of another user in it."""
    path = Path(tempfile.mkdtemp(prefix="cs-shared-"))
    path.chmod(0o1777)
    (path / "someone-else").write_text("not the run's")
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_uid_is_cleaned_before_it_is_handed_out_again(
    sandbox: Sandbox, shared: Path
) -> None:
    """Where runs could write shared folders (no private file system), what a uid left there
    is removed when the uid is returned to its pool, before another run gets it."""
    if not sandbox.isolation.drop_uid:
        pytest.skip("per-run uids need root")
    iso = replace(sandbox.isolation, filesystem="shared", processes="pidns")
    runs = Sandbox(iso, work_root=sandbox.work_root)
    pool = UidPool(UID, 1)
    pool.on_release.append(lambda uid: remove_uid_files(range(uid, uid + 1), [str(shared)]))
    keep = shared / "someone-else"
    code = (
        f"import os\nos.makedirs('{shared}/d/e')\nopen('{shared}/d/e/f', 'w').close()\n"
        f"open('{shared}/top', 'w').close()\nos.symlink('{keep}', '{shared}/link')\n"
    )
    uid = pool.acquire()
    res = await runs.run(job(code), uid=uid)
    assert res.exit_code == 0, res.output
    listed = await asyncio.to_thread(os.listdir, shared)
    assert sorted(listed) == ["d", "link", "someone-else", "top"]
    await asyncio.to_thread(pool.release, uid)
    assert await asyncio.to_thread(os.listdir, shared) == ["someone-else"]
    assert await asyncio.to_thread(keep.read_text) == "not the run's"  # the link's target
    assert pool.acquire() == uid


def test_leftover_run_folders_are_unmounted_and_removed(sandbox: Sandbox) -> None:
    """A server killed mid-run leaves its runs' tmpfs mounts: the next start unmounts and
    empties them (the kept folders of its own uids) and deletes per-run folders of the older
    layout its uids own; another server's are left alone."""
    if not sandbox.isolation.run_tmpfs:
        pytest.skip("no tmpfs per run here")
    root = sandbox.work_root
    root.mkdir(parents=True, exist_ok=True)
    left = create_run_dirs(root, UID, Limits(), tmpfs=True)
    (left.home / "file").write_text("x")
    other = create_run_dirs(root, UID + 1, Limits(), tmpfs=True)
    older = root / "run-abc123"  # a folder of the older layout, left by one of UID's runs
    older.mkdir()
    os.chown(older, UID, UID)
    try:
        assert os.path.ismount(left.root) and left.root.name == f"run-{UID}"
        remove_leftover_run_dirs(root, range(UID, UID + 1))
        assert not os.path.ismount(left.root) and os.listdir(left.root) == []
        assert not older.exists()
        assert os.path.ismount(other.root)  # another server's uid: not this one's to remove
        assert (other.home).is_dir()
    finally:
        remove_leftover_run_dirs(root, range(UID + 1, UID + 2))
    assert leftovers(root) == []
    assert sorted(os.listdir(root)) == [f"run-{UID}", f"run-{UID + 1}"]


def test_a_uid_folder_in_use_is_never_taken_over(sandbox: Sandbox) -> None:
    """A uid serves one run at a time: a second run asking for a live run's uid is refused,
    and the live run's files stay."""
    if not sandbox.isolation.run_tmpfs:
        pytest.skip("no tmpfs per run here")
    sandbox.work_root.mkdir(parents=True, exist_ok=True)
    live = create_run_dirs(sandbox.work_root, UID, Limits(), tmpfs=True)
    try:
        (live.home / "file").write_text("x")
        with pytest.raises(FileExistsError):
            create_run_dirs(sandbox.work_root, UID, Limits(), tmpfs=True)
        assert (live.home / "file").read_text() == "x"
    finally:
        remove_run_dirs(live)
    assert leftovers(sandbox.work_root) == []


def test_the_probe_clears_what_killed_probes_left(sandbox: Sandbox) -> None:
    """A probe killed mid-way leaves its folder mounted: the next probe takes `run-probe`
    over (emptied, unmounted) and removes per-probe folders of the older layout."""
    if not sandbox.isolation.run_tmpfs:
        pytest.skip("no tmpfs per run here")
    root = sandbox.work_root
    root.mkdir(parents=True, exist_ok=True)
    older = create_run_dirs(root, None, Limits(), tmpfs=True)  # a per-run folder
    os.chown(older.root, PROBE_UID, PROBE_UID)
    crashed = create_run_dirs(root, PROBE_UID, Limits(), tmpfs=True, slot=PROBE_SLOT)
    (crashed.home / "file").write_text("x")
    iso = probe_isolation(use_cgroups=False, work_root=root)
    assert iso.run_tmpfs and iso.filesystem_private, iso.notes
    assert not older.root.exists()
    assert not os.path.ismount(crashed.root) and os.listdir(crashed.root) == []
    assert leftovers(root) == [str(root / "probe.lock")]


# In a new mount namespace whose mounts are slaves of the machine's (as bwrap makes it): copy
# every mount recursively, wait, then remount the copy of $2 read-only, as bwrap does to each
# copy right after its `--ro-bind / /`.
BWRAP_STEPS = (
    'mkdir -p "$1" && mount --rbind / "$1" && echo copied && read go'
    ' && mount -o remount,bind,ro "$1$2" && echo remounted'
)


def test_a_run_ending_leaves_a_starting_runs_copies_alone(sandbox: Sandbox, tmp_path: Path) -> None:
    """A run starting copies every mount of the machine, other runs' tmpfs included, and then
    remounts each copy read-only: another run ending between the two must not make that
    remount fail (bwrap then failed the start with 'Unable to apply mount flags: remount
    .../run-...: No such file or directory')."""
    if not sandbox.isolation.run_tmpfs or shutil.which("unshare") is None:
        pytest.skip("no tmpfs per run here, or no unshare(1)")
    root = sandbox.work_root
    ending = create_run_dirs(root, UID, Limits(), tmpfs=True)
    argv = ["unshare", "-m", "--propagation", "slave", "sh", "-c", BWRAP_STEPS, "sh"]
    starting = subprocess.Popen(
        [*argv, str(tmp_path / "newroot"), str(ending.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert starting.stdout is not None and starting.stdout.readline() == "copied\n"
        remove_run_dirs(ending)
        out, err = starting.communicate("go\n", timeout=10)
    finally:
        starting.kill()
        starting.wait()
    assert (starting.returncode, out) == (0, "remounted\n"), err
