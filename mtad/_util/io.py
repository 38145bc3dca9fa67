"""All-or-nothing file writes: a crash or Ctrl-C leaves the old file or folder, never half of a new one."""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (where the filesystem lets a directory be fsynced)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def real_path(path: str | Path) -> Path:
    """``path`` with every symlink resolved (also a dangling one: where its target would be)."""
    return Path(os.path.realpath(path))


def temp_name(name: str, random: str = "x" * 8) -> str:
    """The name of :func:`atomic_write`'s temp file beside a file called ``name`` (``random``: tempfile's eight
    characters), the longest name a write puts in that folder: ``.<name>.<random>.tmp``."""
    return f".{name}.{random}.tmp"


def atomic_write(path: str | Path, data: bytes | str | Callable[[str], None]) -> None:
    """Write ``data`` (bytes, text, or a function that writes a given file name, e.g. ``torch.save``) to a
    temp file beside ``path``, fsync it, then ``os.replace`` it over ``path``. The file keeps the mode of
    the one it replaces (a new file gets 0644). A symlink is written through: the file it points to is
    replaced (beside the target), and the link stays a link."""
    path = real_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix, _, suffix = temp_name(path.name, "\0").partition("\0")  # ".<name>." and ".tmp"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    try:
        if callable(data):
            os.close(fd)
            data(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:  # the old file stays, the temp file goes
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_replace_dir(directory: str | Path, build: Callable[[Path], None]) -> Path:
    """Run ``build(tmp)`` in a sibling temp folder, then swap it in for ``directory`` (the old one is removed
    only after the new one is in place); a failing ``build`` leaves ``directory`` as it was."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    tmp.chmod(0o755)
    try:
        build(tmp)
        old = directory.with_name(f".{directory.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if directory.exists():
            directory.rename(old)
        tmp.rename(directory)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(directory.parent)
    return directory


def file_sha256(path: Path) -> str:
    """sha256 hex of a file's bytes (as stored, so a .gz file is hashed compressed), read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def read_safetensors(path: str | Path) -> dict:
    """The tensors of a safetensors file; a truncated or corrupt file is a ValueError naming it (the library's
    own error is a bare ``SafetensorError`` without the file's name)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}): the weights are corrupt or "
                         f"truncated; re-export or restore that file (git checkout, make train-draft)") from None


def writable_dir(path: str | Path, what: str) -> Path:
    """``path`` as a folder this process can write into (created with its parents when missing); else a
    ValueError naming ``what`` (the option) and the fix. Nothing that exists is changed."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path} is a file, not a folder: give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".mtad-write-check-"):
            pass
    except OSError as err:
        raise ValueError(f"{what} {path} cannot be written ({err.strerror or err}): give a folder you can "
                         f"write") from None
    return path


def writable_file(path: str | Path, what: str) -> Path:
    """``path`` as a file this process can create or replace (its folder created when missing); else a
    ValueError. The file itself is not created."""
    path = Path(path).expanduser()
    if len(path.name.encode()) > 255:
        raise ValueError(f"{what} {path.name[:40]!r}... is a {len(path.name.encode())}-byte file name: a file name "
                         f"holds at most 255 bytes; give a shorter one")
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder: give a file name")
    writable_dir(path.parent if str(path.parent) else Path("."), f"{what}'s folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{what} {path} cannot be written (read-only): give another file")
    return path
