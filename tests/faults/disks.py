"""Data directories on small filesystems of their own, that a scenario fills or breaks.

* :class:`Tmpfs` — a small tmpfs; ``fill`` writes a file until only a few MiB
  are left (a disk that fills up), ``repair`` deletes it.
* :class:`Ext4Loop` — ext4 on a loop device, mounted ``errors=remount-ro``;
  ``break_`` makes the kernel record a filesystem error
  (``/sys/fs/ext4/<dev>/trigger_fs_error``), and ext4 turns the filesystem
  read-only at once, under the open WAL: what a failing disk does. (A plain
  ``mount -o remount,ro`` is refused while a file is open for writing, which the
  WAL always is.) ``repair`` is the operator's: unmount (the instance stopped),
  fsck, mount again.

Every mount is undone by ``close`` (lazily, so a leftover process cannot keep it).
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import subprocess
from pathlib import Path


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


def cleanup_stale(base: Path) -> list[str]:
    """Unmount what a crashed run left mounted under base, and detach its loop devices; what was undone."""
    undone = []
    for line in Path("/proc/mounts").read_text().splitlines():
        target = line.split()[1]
        if target.startswith(str(base) + "/"):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
            undone.append(target)
    listing = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout
    for line in listing.splitlines():
        device, _, rest = line.partition(":")
        if f"({base}/" in rest:
            subprocess.run(["losetup", "-d", device], check=False, capture_output=True)
            undone.append(device)
    return undone


class Tmpfs:
    def __init__(self, mountpoint: Path, size_mb: int) -> None:
        self.mountpoint = mountpoint
        self.size_mb = size_mb
        self.filler = mountpoint / "filler"

    def mount(self) -> Tmpfs:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.mountpoint))
        return self

    def fill(self, leave_bytes: int) -> None:
        """Write zeros until the filesystem has only leave_bytes free."""
        chunk = b"\0" * (1 << 20)
        with self.filler.open("ab", buffering=0) as f:
            while (free := shutil.disk_usage(self.mountpoint).free) > leave_bytes:
                f.write(chunk[: min(len(chunk), free - leave_bytes)])

    def repair(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        if mounted(self.mountpoint):
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=False, capture_output=True)


class Ext4Loop:
    def __init__(self, mountpoint: Path, image: Path, size_mb: int) -> None:
        self.mountpoint = mountpoint
        self.image = image
        self.size_mb = size_mb
        self.device = ""

    def mount(self) -> Ext4Loop:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with self.image.open("wb") as f:
            f.truncate(self.size_mb << 20)
        self.device = _run("losetup", "-f", "--show", str(self.image)).strip()
        _run("mkfs.ext4", "-q", "-F", self.device)
        self._mount()
        return self

    def _mount(self) -> None:
        _run("mount", "-o", "errors=remount-ro", self.device, str(self.mountpoint))

    def break_(self) -> None:
        """A filesystem error: ext4 remounts itself read-only."""
        Path(f"/sys/fs/ext4/{Path(self.device).name}/trigger_fs_error").write_text("scf fault test\n")

    @property
    def read_only(self) -> bool:
        """Writes fail with EROFS. (ext4 sets its superblock read-only; /proc/mounts still says rw.)"""
        probe = self.mountpoint / ".scf-probe"
        try:
            probe.write_text("x")
        except OSError as e:
            return e.errno == errno.EROFS
        probe.unlink()
        return False

    def repair(self) -> None:
        """Unmount (nothing may use it: stop the instance first), fsck, mount read-write again."""
        _run("umount", str(self.mountpoint))
        subprocess.run(["e2fsck", "-fy", self.device], capture_output=True, timeout=120, check=False)
        self._mount()

    def close(self) -> None:
        if mounted(self.mountpoint):
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=False, capture_output=True)
        if self.device:
            subprocess.run(["losetup", "-d", self.device], check=False, capture_output=True)
            self.device = ""
        with contextlib.suppress(OSError):
            self.image.unlink()
