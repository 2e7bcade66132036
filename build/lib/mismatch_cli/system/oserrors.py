"""One translation of file-system errors into messages that name the path, the real cause and the fix."""

from __future__ import annotations

import errno
import os

from mismatch_cli.errors import InputError, MismatchError, UsageError

# errno -> (cause, fix when reading an input, fix when writing an output)
_CAUSES: dict[int, tuple[str, str, str]] = {
    errno.EACCES: (
        "permission denied",
        "give your user read access (ls -l shows the owner and mode; chmod / chown fixes it)",
        "write somewhere you may write, or give your user write access to the folder (ls -ld shows it)",
    ),
    errno.ELOOP: (
        "symbolic link loop (too many levels of symbolic links)",
        "point at the real file; readlink -f shows where the links lead",
        "point at a real folder; readlink -f shows where the links lead",
    ),
    errno.ENAMETOOLONG: (
        "name too long (at most 255 bytes per file or folder name, 4096 for the whole path)",
        "rename or move the file to a shorter path",
        "choose a shorter file name or path",
    ),
    errno.EISDIR: (
        "it is a directory",
        "name a dump file, or pass the folder itself to read every dump in it",
        "give a file name (use --out-dir for a folder of outputs)",
    ),
    errno.ENOTDIR: (
        "a part of the path is a file, not a folder",
        "check the path",
        "check the path: every part before the file name must be a folder",
    ),
    errno.ENOENT: (
        "no such file or directory",
        "check the path",
        "check the path: the folder must exist and accept new files (/proc and /sys do not)",
    ),
    errno.ENOSPC: (
        "no space left on the device",
        "free some space",
        "free some space, or write to another device",
    ),
    errno.EDQUOT: (
        "disk quota exceeded",
        "free some space",
        "free some space, or write to another device",
    ),
    errno.EROFS: (
        "read-only file system",
        "copy the file to a readable place",
        "write to a writable file system",
    ),
    errno.EFBIG: (
        "file too large for the file system",
        "copy the file to another file system",
        "write to another file system",
    ),
    errno.EIO: (
        "input/output error from the device",
        "check the disk or network mount, then retry",
        "check the disk or network mount, then retry",
    ),
}
_CAUSES[errno.EPERM] = ("operation not permitted", *_CAUSES[errno.EACCES][1:])


def explain_os_error(exc: OSError, path: str | os.PathLike | None = None, *, writing: bool = False,
                     flag: str | None = None) -> MismatchError:
    """The user-facing error for `exc` on `path`: InputError (exit 3) reading, UsageError (exit 2) writing."""
    shown = os.fsdecode(path) if path is not None else os.fsdecode(exc.filename or "?")
    shown = f"{flag} {shown}" if flag else shown
    known = _CAUSES.get(exc.errno or -1)
    if known is None:
        cause = exc.strerror or str(exc).strip() or type(exc).__name__
        fix = "check the path and its permissions"
    else:
        cause, read_fix, write_fix = known
        fix = write_fix if writing else read_fix
    if writing:
        return UsageError(f"cannot write {shown}: {cause}", hint=fix)
    return InputError(f"cannot read {shown}: {cause}", hint=fix)


__all__ = ["explain_os_error"]
