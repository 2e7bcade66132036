"""Every file a command writes goes through here, so that no input is overwritten and nothing is left half-written.

- A path that is one of the command's inputs (the same resolved path, or the same file through a
  hard link) is refused before anything is written.
- Regular files are written under a temporary name in their folder, then renamed over the target;
  special files (a character device such as /dev/null, a FIFO, /dev/fd/N) are written directly, so
  that the device node is never replaced by a regular file.
- `Outputs.commit` moves a command's files into place together: every file is written first, then
  all are renamed; a failure (or a signal) on any of them removes what was written and restores the
  files the run had replaced, so an `--out-dir` is all-or-nothing.
- File-system errors become one-line errors naming the flag and the path (`oserrors`).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mismatch_cli.errors import UsageError
from mismatch_cli.system.guard import raise_pending
from mismatch_cli.system.oserrors import explain_os_error

_TEMP_PREFIX = ".mismatch-"  # short, so that a target name near the 255-byte limit still gets a temporary name
_NAME_MAX = 255
_PATH_MAX = 4096


@dataclass
class _Planned:
    path: Path
    data: bytes
    flag: str


def _named(flag: str, path: str | os.PathLike) -> str:
    return f"{flag} {os.fspath(path)}" if flag else os.fspath(path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _local(path: str | os.PathLike, flag: str) -> Path:
    """The output as a local Path; a URL (`s3://…`) is refused rather than written as a folder named `s3:`."""
    text = os.fspath(path)
    # A Path has already folded `s3://b` into `s3:/b` (typer makes --out-dir one), hence the single slash.
    if isinstance(text, str) and (re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text)
                                  or re.match(r"^(s3|gs|gcs|https?|hdfs|az|abfss?):/", text, re.IGNORECASE)):
        raise UsageError(f"cannot write {flag} {text}: outputs are local files (object stores are read, never "
                         "written)", hint=f"give {flag} a local path, then copy the result with your storage client")
    return Path(path)


def _stat(path: Path, flag: str) -> os.stat_result | None:
    """The target's stat (following links), None when it does not exist yet; other failures explained."""
    raw = os.fsencode(path)
    if len(raw) >= _PATH_MAX or any(len(part) > _NAME_MAX for part in raw.split(b"/")):
        raise explain_os_error(OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG)), path, writing=True,
                               flag=flag)
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise UsageError(f"cannot write {_named(flag, path)}: it is a symbolic link to a missing file",
                             hint="remove the dangling link, or write to another path") from None
        return None
    except OSError as exc:
        raise explain_os_error(exc, path, writing=True, flag=flag) from None


def _special(info: os.stat_result | None) -> bool:
    return info is not None and not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode)


class Outputs:
    """The files one command writes: checked against its inputs up front, then committed together."""

    def __init__(self, inputs: Iterable[str | os.PathLike] = ()) -> None:
        self._inputs: dict[str, tuple[int, int] | None] = {}
        self._planned: list[_Planned] = []
        self.protect(inputs)

    def protect(self, paths: Iterable[str | os.PathLike]) -> None:
        """Add input files that no output may overwrite (paths that do not exist are ignored)."""
        for path in paths:
            if path is None or os.fspath(path) in ("", "-"):
                continue
            try:
                info = os.stat(path)
            except (OSError, ValueError):
                continue
            if stat.S_ISREG(info.st_mode):
                self._inputs[os.path.realpath(path)] = (info.st_dev, info.st_ino)

    def check(self, path: str | os.PathLike, flag: str) -> Path:
        """Refuse now a file output that cannot be written: an input, a folder, a URL, a bad name or parent, or `-`
        (standard output carries the command's own output; only `-o -` puts that there)."""
        if str(path) == "-" and flag != "-o":
            raise UsageError(f"{flag} -: standard output already carries the command's output",
                             hint=f"give {flag} a file name (-o - is the way to put the output itself on stdout)")
        target = _local(path, flag)
        key = os.path.realpath(target)
        owner = next((item.flag for item in self._planned if os.path.realpath(item.path.parent) == key), None)
        if owner is not None:
            raise UsageError(f"cannot write {_named(flag, target)}: it is the folder {owner} writes into",
                             hint="give each output its own path")
        info = _stat(target, flag)
        if info is not None and stat.S_ISDIR(info.st_mode):
            raise UsageError(f"cannot write {_named(flag, target)}: it is a directory",
                             hint="give a file name (use --out-dir for a folder of outputs)")
        if info is not None and stat.S_ISREG(info.st_mode):
            self._refuse_input(target, info, flag)
            _writable(target.parent, target, flag)  # replaced through a temporary file beside it
        elif info is None:
            self._check_parent(target, flag)
        return target

    def check_dir(self, path: str | os.PathLike, flag: str) -> Path:
        """Refuse now an output folder that cannot be made: an existing file, a URL, a bad name or parent."""
        target = _local(path, flag)
        info = _stat(target, flag)
        if info is not None and not stat.S_ISDIR(info.st_mode):
            raise UsageError(f"cannot write {_named(flag, target)}: it exists and is not a directory",
                             hint=f"pass a directory to {flag}")
        if info is not None:
            _writable(target, target, flag)
        else:
            self._check_parent(target, flag)
        return target

    def add(self, path: str | os.PathLike, data: str | bytes, flag: str) -> None:
        """Plan one file (text is written as UTF-8); nothing is written before `commit`."""
        target = self.check(path, flag)
        key = os.path.realpath(target)
        if any(os.path.realpath(p.path) == key for p in self._planned):
            raise UsageError(f"{_named(flag, target)} is also written by another output of this command",
                             hint="give each output its own path")
        self._planned.append(_Planned(target, data.encode("utf-8") if isinstance(data, str) else data, flag))

    def commit(self) -> list[Path]:
        """Write every planned file, all or none; returns their paths."""
        planned, self._planned = self._planned, []
        for item in planned:
            self.check(item.path, item.flag)  # inputs may have been added since the file was planned
        created: list[Path] = []
        temps: dict[int, str] = {}
        moved: list[tuple[Path, str | None]] = []
        current = planned[0] if planned else None
        try:
            for index, item in enumerate(planned):
                info = _stat(item.path, item.flag)
                if _special(info):
                    continue
                created += _make_parents(item.path, item.flag)
                temps[index] = _write_temp(item)
            for item in planned:
                if _special(_stat(item.path, item.flag)):
                    _write_special(item)
            for index, tmp in list(temps.items()):
                raise_pending()  # nothing moves into place after a signal
                current = planned[index]
                target = current.path
                backup = _backup(target)
                moved.append((target, backup))
                os.replace(tmp, target)
                del temps[index]
        except BaseException as exc:
            for target, backup in reversed(moved):
                _restore(target, backup)
            for tmp in temps.values():
                _unlink(tmp)
            _remove_dirs(created)
            if isinstance(exc, OSError) and current is not None:
                raise explain_os_error(exc, current.path, writing=True, flag=current.flag) from None
            raise
        for _, backup in moved:
            if backup is not None:
                _unlink(backup)
        return [item.path for item in planned]

    def _refuse_input(self, target: Path, info: os.stat_result, flag: str) -> None:
        real = os.path.realpath(target)
        for path, identity in self._inputs.items():
            if path == real or identity == (info.st_dev, info.st_ino):
                shown = "" if path == real else f" (the same file as input {path})"
                raise UsageError(f"cannot write {_named(flag, target)}: it is an input of this command{shown}, and "
                                 "writing it would destroy that input", hint="write the output to another path")

    def _check_parent(self, target: Path, flag: str) -> None:
        # The nearest existing ancestor must be a folder (else every mkdir below it fails with ENOTDIR).
        parent = target.parent
        while True:
            try:
                info = os.stat(parent)
            except FileNotFoundError:
                if parent == parent.parent:
                    return
                parent = parent.parent
                continue
            except OSError as exc:
                raise explain_os_error(exc, target, writing=True, flag=flag) from None
            if not stat.S_ISDIR(info.st_mode):
                raise explain_os_error(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)), target, writing=True,
                                       flag=flag)
            _writable(parent, target, flag)
            return


def _writable(folder: Path, target: Path, flag: str) -> None:
    """Refuse now (before any analysis) an output whose folder cannot be written into: no permission, read-only."""
    if os.access(folder, os.W_OK | os.X_OK):
        return
    code = errno.EROFS if _read_only(folder) else errno.EACCES
    raise explain_os_error(OSError(code, os.strerror(code), str(folder)), target, writing=True, flag=flag)


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def _make_parents(path: Path, flag: str) -> list[Path]:
    """Create the missing folders above `path`, outermost first, and return them (to remove on failure)."""
    missing: list[Path] = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    created = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            _remove_dirs(created)
            raise explain_os_error(exc, folder, writing=True, flag=flag) from None
        created.append(folder)
    return created


def _remove_dirs(created: list[Path]) -> None:
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            pass  # not empty: something else wrote there meanwhile; leave it


def _unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_temp(item: _Planned) -> str:
    try:
        fd, tmp = tempfile.mkstemp(dir=item.path.parent, prefix=_TEMP_PREFIX, suffix=".tmp")
    except OSError as exc:
        raise explain_os_error(exc, item.path, writing=True, flag=item.flag) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(item.data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; an output gets the usual permissions
    except BaseException as exc:
        _unlink(tmp)
        if isinstance(exc, OSError):
            raise explain_os_error(exc, item.path, writing=True, flag=item.flag) from None
        raise
    return tmp


def _write_special(item: _Planned) -> None:
    try:
        with open(item.path, "wb") as handle:  # a device or FIFO: O_TRUNC does nothing to it
            handle.write(item.data)
    except OSError as exc:
        raise explain_os_error(exc, item.path, writing=True, flag=item.flag) from None


def _backup(target: Path) -> str | None:
    """A hard link to the file about to be replaced, to put it back if a later output fails; None if none."""
    if not target.exists():
        return None
    for _ in range(8):
        name = str(target.parent / f"{_TEMP_PREFIX}{os.urandom(4).hex()}.bak")
        try:
            os.link(target, name)
            return name
        except FileExistsError:
            continue
        except OSError:
            return None  # a file system without hard links: the replaced file cannot be kept
    return None


def _restore(target: Path, backup: str | None) -> None:
    try:
        if backup is None:
            os.unlink(target)
        else:
            os.replace(backup, target)
    except OSError:
        pass


def write_file(path: str | os.PathLike, data: str | bytes, flag: str,
               inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Write one file atomically (or directly, for a device or FIFO), refusing to overwrite an input."""
    outputs = Outputs(inputs)
    outputs.add(path, data, flag)
    return outputs.commit()[0]


@contextmanager
def streamed_file(path: str | os.PathLike, flag: str, inputs: Iterable[str | os.PathLike] = ()) -> Iterator[str]:
    """Yield a path to write a large output into; it becomes `path` only when the block succeeds.

    A regular target is written as a temporary file in its folder and renamed at the end; on any
    failure (a signal included) the temporary file and the folders made for it are removed.
    """
    outputs = Outputs(inputs)
    target = outputs.check(path, flag)
    if _special(_stat(target, flag)):
        try:
            yield str(target)
        except OSError as exc:
            raise explain_os_error(exc, target, writing=True, flag=flag) from None
        return
    created = _make_parents(target, flag)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_TEMP_PREFIX, suffix=".tmp")
        os.close(fd)
    except OSError as exc:
        _remove_dirs(created)
        raise explain_os_error(exc, target, writing=True, flag=flag) from None
    try:
        yield tmp
        raise_pending()  # nothing moves into place after a signal
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as exc:
        _unlink(tmp)
        _remove_dirs(created)
        if isinstance(exc, OSError):
            raise explain_os_error(exc, target, writing=True, flag=flag) from None
        raise


def append_text(path: str | os.PathLike, text: str) -> str | None:
    """Append to a file meant to be appended to (GITHUB_STEP_SUMMARY); returns a warning instead of raising."""
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        return f"cannot append to {path}: {explain_os_error(exc, path, writing=True).message.split(': ', 1)[-1]}"
    return None


__all__ = ["Outputs", "append_text", "streamed_file", "write_file"]
