"""Files: atomic writes (a temporary file or folder beside the target, then a rename; never a half-written
file or folder), results folders replaced only once their new version is complete, and the readers of JSON
and safetensors files that name the file when it cannot be read."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file next to `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")  # same folder: os.replace stays atomic
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def check_output_folder(path: Path, inputs: Iterable = ()) -> None:
    """`ValueError` if writing a folder at `path` (replacing what is there) would destroy what it must not:
    the current folder or one of its parents, the home folder, or one of `inputs` (the input itself)."""
    resolved = Path(path).expanduser().resolve()
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise ValueError(f"output {path} is the current folder or one of its parents; name a new folder")
    if resolved == Path.home().resolve():
        raise ValueError(f"output {path} is the home folder; name a new folder")
    for source in inputs:
        if Path(source).exists() and resolved == Path(source).expanduser().resolve():
            raise ValueError(f"output {path} is the input {source} itself; name a new folder")


def _staging_prefix(path: Path) -> str:
    return f".{path.name}.staging."


# `.<name>.staging.<pid>@<host>.<random>`: the writer is named so that a later write can tell a folder a
# killed writer left from one a live writer is filling (folders without a writer predate this scheme)
_STAGING = re.compile(r"^\..+\.staging\.(?P<pid>\d+)@(?P<host>.+)\.[A-Za-z0-9_]+$")


def _writer_is_gone(staging: Path) -> bool | None:
    """Whether the process that made the staging folder `staging` has ended: `True` when it ran on this host
    and no process has its pid, `False` when one has (perhaps a reused pid: kept, to be safe) or it ran on
    another host, `None` when the name records no writer."""
    match = _STAGING.match(staging.name)
    if match is None:
        return None
    if match["host"] != socket.gethostname():
        return False
    try:
        os.kill(int(match["pid"]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def remove_abandoned_staging(folder: Path) -> None:
    """Remove the staging folders in `folder` whose writer was killed (`_writer_is_gone`), whatever output
    they were for; those of live writers, of other hosts and of unknown writers stay."""
    for entry in Path(folder).glob(".*.staging.*"):
        if _writer_is_gone(entry):
            _remove(entry)


def _umask() -> int:
    """The process's umask (read without changing it where /proc tells it)."""
    try:
        return int(re.search(r"Umask:\s*([0-7]+)", Path("/proc/self/status").read_text())[1], 8)
    except (OSError, TypeError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def _replaced_prefix(path: Path) -> str:
    return f".{path.name}.replaced."


def recover_output(path: Path) -> None:
    """Clean up what a killed write of the folder `path` left beside it: a folder moved aside for the
    replacement while `path` is missing (the kill fell between the two renames) is moved back, so that the old
    complete version is there; staging folders and other moved-aside folders are removed. One writer per
    output at a time is assumed (staging folders of a live writer are kept all the same), and abandoned
    staging folders of other outputs in the same parent folder go too (`remove_abandoned_staging`)."""
    path = Path(path)
    if not path.parent.is_dir():
        return
    replaced = sorted(path.parent.glob(f"{_replaced_prefix(path)}*"), key=lambda p: p.stat().st_mtime)
    if replaced and not (path.exists() or path.is_symlink()):
        replaced.pop().rename(path)
    staging = [p for p in path.parent.glob(f"{_staging_prefix(path)}*") if _writer_is_gone(p) is not False]
    for leftover in [*replaced, *staging]:
        _remove(leftover)
    remove_abandoned_staging(path.parent)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def replace_path(new: Path, path: Path) -> None:
    """Put `new` (a folder or file) at `path`; what was there is moved aside first and deleted last, so that
    a kill at any instant leaves the old complete version or the new one (`recover_output` tidies up)."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        aside = path.with_name(f"{_replaced_prefix(path)}{uuid.uuid4().hex}")
        path.rename(aside)
        Path(new).rename(path)
        _remove(aside)
    else:
        Path(new).rename(path)


@contextmanager
def staged_folder(path: Path, overwrite: bool = False, inputs: Iterable = ()) -> Iterator[Path]:
    """A new temporary folder beside `path` to write into, put at `path` when the block ends without an
    error (replacing `path` only with `overwrite`; `replace_path`), removed otherwise. Refuses outputs that
    must not be replaced (`check_output_folder`, `inputs`: what the command reads) and first cleans up what a
    killed earlier write left (`recover_output`)."""
    path = Path(path)
    check_output_folder(path, inputs)
    recover_output(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise ValueError(
            f"{path} exists and is not an empty folder; pass overwrite=True (--overwrite) to replace it"
        )
    writer = f"{_staging_prefix(path)}{os.getpid()}@{socket.gethostname()}."
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=writer))
    except OSError as err:
        file = next((p for p in path.parents if p.is_file()), None)
        reason = f"{file} is a file" if file is not None else f"{err.strerror} in {path.parent}"
        raise type(err)(f"cannot write the folder {path}: {reason}") from None
    staging.chmod(0o777 & ~_umask())  # as a plain mkdir makes it (mkdtemp's is 0700)
    try:
        yield staging
        replace_path(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextmanager
def staged_update(path: Path, owned: Callable[[str], bool]) -> Iterator[Path]:
    """`staged_folder` for a folder that may hold other files (a `save_pretrained` beside a tokenizer): the
    new version is written into a staging folder, the old folder's entries that the write neither wrote nor
    owns (`owned(name)`: what a previous write of the same kind wrote, such as weight shards) are carried
    over (hard links; copies where linking fails), then it replaces the old folder (`replace_path`). Written
    in place where the folder cannot be replaced (the current folder, a parent of it, the home folder)."""
    path = Path(path)
    if path.is_file():
        raise ValueError(f"{path} is a file; save into a folder")
    try:
        check_output_folder(path)
    except ValueError:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with staged_folder(path, overwrite=True) as staging:
        yield staging
        if path.is_dir():
            for entry in path.iterdir():
                if not (staging / entry.name).exists() and not owned(entry.name) and entry.name[0] != ".":
                    _carry(entry, staging / entry.name)


def _carry(source: Path, target: Path) -> None:
    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(source, target)


def _link_or_copy(source, target) -> None:
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, target, follow_symlinks=False)


def atomic_write_folder(path: Path, files: dict[str, bytes], stale: Iterable[str] = ()) -> None:
    """Write `files` (name -> bytes) into the folder `path` as one version (`staged_update`): a kill leaves
    the old complete folder or the new one. The names in `stale` that `files` does not hold are dropped; the
    folder's other files are kept."""
    path = Path(path)
    owned = set(files) | set(stale)
    with staged_update(path, owned=owned.__contains__) as folder:
        for name, data in files.items():
            atomic_write_bytes(folder / name, data)
        if folder == path:  # written in place (the current folder): nothing carried, so drop by hand
            for name in set(stale) - set(files):
                (path / name).unlink(missing_ok=True)


def require_hub_id_or_existing_path(name: str, what: str) -> None:
    """`FileNotFoundError` naming `what` when `name` can only be a local path (it starts with `/`, `./`,
    `../` or `~`, or holds a backslash or more than one `/`, which a Hub id `org/name` never does) and
    nothing is there: a typo in a local path is reported as such, not as an unknown Hub id."""
    local = name.startswith(("/", "./", "../", "~")) or "\\" in name or name.count("/") > 1
    if local and not Path(name).expanduser().exists():
        raise FileNotFoundError(f"{what} {name!r}: no such file or folder")


def require_checkpoint_folder(name, what: str = "checkpoint") -> None:
    """`require_hub_id_or_existing_path` for a checkpoint (a folder or a Hub id), and `NotADirectoryError`
    when `name` is a local file: it is not read as a Hub id."""
    require_hub_id_or_existing_path(str(name), what)
    if Path(name).expanduser().is_file():
        raise NotADirectoryError(f"{what} {str(name)!r} is a file; expected a checkpoint folder or a Hub id")


def read_config_json(folder: Path) -> dict:
    """The `config.json` of the local checkpoint folder `folder` as a dict; `FileNotFoundError` when it has
    none (with what it holds), `ValueError` naming the file when it is not valid JSON or not an object."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        found = sorted(p.name for p in Path(folder).iterdir())[:8]
        raise FileNotFoundError(
            f"{folder} has no config.json: not a transformers checkpoint (found: {found})"
        )
    config = read_json(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a JSON {type(config).__name__}, not an object of config keys")
    return config


def read_json(path: Path) -> Any:
    """The JSON in `path`, or `None` when the file does not exist; `ValueError` naming the file when it
    is not valid JSON (truncated or corrupt)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON (truncated or corrupt?): {err}") from None


@contextmanager
def open_safetensors(path) -> Iterator:
    """`safetensors.safe_open(path)` (PyTorch tensors), with `ValueError` naming the file when its header
    cannot be read (a truncated or corrupt file)."""
    try:
        handle = safe_open(str(path), framework="pt")
    except SafetensorError as err:
        raise ValueError(f"{path} is not a readable safetensors file (truncated or corrupt?): {err}") from err
    with handle as f:
        yield f


def check_safetensors_folder(folder) -> None:
    """Read the header of every `*.safetensors` file in the local `folder` (nothing when it is not a local
    folder: a Hub id), so that a truncated file is named before a loader fails on it without its name."""
    if Path(folder).is_dir():
        for path in sorted(Path(folder).glob("*.safetensors")):
            with open_safetensors(path):
                pass


def set_aside(path: Path, inputs: Iterable = ()) -> None:
    """Move the results folder `path` aside (a hidden sibling) so that a run replacing it starts in an empty
    folder while the old results stay on disk until `discard_set_aside` (called once the new results are
    complete); a kill in between leaves them beside the new run, and `recover_output` puts them back while
    `path` is missing. Refuses what `check_output_folder` refuses."""
    path = Path(path)
    check_output_folder(path, inputs)
    recover_output(path)
    if path.exists() or path.is_symlink():
        path.rename(path.with_name(f"{_replaced_prefix(path)}{uuid.uuid4().hex}"))


def discard_set_aside(path: Path) -> None:
    """Delete the old results that `set_aside` kept beside `path`."""
    path = Path(path)
    for old in path.parent.glob(f"{_replaced_prefix(path)}*"):
        _remove(old)
