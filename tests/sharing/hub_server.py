"""A tiny Hugging Face Hub on 127.0.0.1 for tests: the endpoints `huggingface_hub` 2.4 uses to create a repo
and a branch, upload (preupload, basic LFS batch + PUT + verify, NDJSON commit) and download (`resolve`).

It speaks basic LFS only: with `hf_xet` installed the client would upload through Xet (`upload_folder` goes
through the Xet pipeline), so clients must run with `HF_HUB_DISABLE_XET=1`. Every POST needs `Bearer <token>`;
LFS PUTs carry a signature in the url instead, like presigned S3 urls.
Blobs are stored by sha256 under `root/blobs`; each commit is a `{path: FileEntry}` tree kept in memory.

    with FakeHub(tmp_path) as hub:  # hub.url -> HF_ENDPOINT
        ...
        hub.files("alice/model")  # {path: bytes} at the head of main
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "hf_fake_test_token"
DEFAULT_USER = "user"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".npz")
LFS_MIN_SIZE = 10 * 1024 * 1024


@dataclass
class FileEntry:
    sha256: str
    size: int
    lfs: bool

    def oid(self, data: bytes) -> str:
        """What preupload reports and downloads use as ETag: sha256 for LFS, the git blob sha1 otherwise."""
        return self.sha256 if self.lfs else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    private: bool
    branches: dict[str, str] = field(default_factory=dict)  # branch -> commit oid
    trees: dict[str, dict[str, FileEntry]] = field(default_factory=dict)  # commit oid -> files
    pulls: int = 0


class FakeHub:
    """Threaded server; `requests`, `commits` and `lfs_uploads` record what the clients did."""

    def __init__(self, root: Path, token: str = TOKEN):
        self.blobs = Path(root) / "blobs"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.commits: list[dict] = []  # repo_id, revision, summary, description, create_pr, files, oid
        self.lfs_uploads: list[str] = []  # sha256 of the objects PUT
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.hub = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def head(self, repo_id: str, revision: str = "main") -> str | None:
        """The commit oid `revision` (branch or oid) points to, None if unknown."""
        repo = self.repos[repo_id]
        return revision if revision in repo.trees else repo.branches.get(revision)

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """The files of `repo_id` at `revision`, read back from the blob store."""
        tree = self.repos[repo_id].trees[self.head(repo_id, revision)]
        return {path: self.read(entry.sha256) for path, entry in tree.items()}

    def read(self, sha256: str) -> bytes:
        return (self.blobs / sha256).read_bytes()

    def store(self, data: bytes) -> str:
        sha256 = hashlib.sha256(data).hexdigest()
        (self.blobs / sha256).write_bytes(data)
        return sha256

    def sign(self, oid: str) -> str:
        return hashlib.sha256(f"{self.token}:{oid}".encode()).hexdigest()

    def new_commit(self, repo: Repo, tree: dict[str, FileEntry], parent: str | None, summary: str) -> str:
        payload = {path: entry.sha256 for path, entry in sorted(tree.items())}
        oid = hashlib.sha1(json.dumps([payload, parent, summary, len(repo.trees)]).encode()).hexdigest()
        repo.trees[oid] = tree
        return oid


class _Handler(BaseHTTPRequestHandler):
    server: ThreadingHTTPServer

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    @property
    def hub(self) -> FakeHub:
        return self.server.hub

    # -- plumbing
    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _send(self, status: int, body=b"", headers: dict | None = None, head_only: bool = False) -> None:
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        self.send_response(status)
        for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if not head_only:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str = "", head_only: bool = False, **headers) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message or code, **headers}
        self._send(status, {"error": message or code}, headers, head_only)

    def _authorized(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def _route(self, method: str) -> None:
        parts = urlsplit(self.path)
        path, query = unquote(parts.path), parse_qs(parts.query)
        with self.hub.lock:
            self.hub.requests.append((method, path))
        if method == "POST" and not self._authorized():
            return self._error(401, "Unauthorized", "Invalid credentials in Authorization header")
        for pattern, handler in _ROUTES[method]:
            match = re.fullmatch(pattern, parts.path)
            if match:
                args = [unquote(group) for group in match.groups()]
                with self.hub.lock:
                    return handler(self, *args, query=query)
        return self._error(404, "NotFound", f"no route for {method} {path}")

    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def _repo(self, repo_id: str, head_only: bool = False) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            self._error(404, "RepoNotFound", f"repository {repo_id} not found", head_only)
            return None
        return repo

    # -- repos and branches
    def create_repo(self, query) -> None:
        payload = json.loads(self._body())
        repo_id = f"{payload.get('organization') or DEFAULT_USER}/{payload['name']}"
        if repo_id in self.hub.repos:
            return self._send(
                409, {"error": "You already created this model repo", "url": f"{self.hub.url}/{repo_id}"}
            )
        repo = Repo(private=payload.get("visibility") == "private")
        repo.branches["main"] = self.hub.new_commit(repo, {}, None, "initial commit")
        self.hub.repos[repo_id] = repo
        self._send(200, {"url": f"{self.hub.url}/{repo_id}", "name": repo_id})

    def create_branch(self, repo_id, branch, query) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return None
        if branch in repo.branches:
            return self._error(409, "BranchExists", f"branch {branch} already exists")
        start = json.loads(self._body() or b"{}").get("startingPoint", "main")
        if self.hub.head(repo_id, start) is None:
            return self._error(404, "RevisionNotFound", f"revision {start} not found")
        repo.branches[branch] = self.hub.head(repo_id, start)
        self._send(200, {})

    def repo_info(self, repo_id, revision="main", query=None) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return None
        oid = self.hub.head(repo_id, revision)
        if oid is None:
            return self._error(404, "RevisionNotFound", f"revision {revision} not found")
        siblings = [{"rfilename": path} for path in sorted(repo.trees[oid])]
        self._send(200, {"id": repo_id, "sha": oid, "private": repo.private, "siblings": siblings})

    def validate_yaml(self, query) -> None:
        self._body()
        self._send(200, {})

    # -- upload
    def preupload(self, repo_id, revision, query) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return None
        tree = repo.trees.get(self.hub.head(repo_id, revision) or "", {})
        files = []
        for item in json.loads(self._body())["files"]:
            path, size = item["path"], item["size"]
            binary = b"\0" in base64.b64decode(item["sample"])
            lfs = path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE or binary
            existing = tree.get(path)
            oid = existing.oid(self.hub.read(existing.sha256)) if existing else None
            files.append(
                {"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid}
            )
        self._send(200, {"files": files})

    def lfs_batch(self, repo_id, query) -> None:
        if self._repo(repo_id) is None:
            return None
        payload = json.loads(self._body())
        if payload.get("operation") != "upload" or "basic" not in payload.get("transfers", ["basic"]):
            return self._error(400, "BadRequest", "only basic LFS uploads are supported")
        objects = []
        for obj in payload["objects"]:
            oid = obj["oid"]
            entry = {"oid": oid, "size": obj["size"]}
            if not (self.hub.blobs / oid).exists():
                entry["actions"] = {
                    # like a presigned S3 url: the client PUTs there without its token
                    "upload": {"href": f"{self.hub.url}/lfs-upload/{oid}?sig={self.hub.sign(oid)}"},
                    "verify": {"href": f"{self.hub.url}/lfs-verify"},
                }
            objects.append(entry)
        self._send(
            200, {"transfer": "basic", "objects": objects}, {"Content-Type": "application/vnd.git-lfs+json"}
        )

    def lfs_upload(self, oid, query) -> None:
        data = self._body()
        if query.get("sig") != [self.hub.sign(oid)]:
            return self._error(403, "Forbidden", "bad upload signature")
        if hashlib.sha256(data).hexdigest() != oid:
            return self._error(400, "BadRequest", "sha256 mismatch")
        self.hub.store(data)
        self.hub.lfs_uploads.append(oid)
        self._send(200)

    def lfs_verify(self, query) -> None:
        payload = json.loads(self._body())
        blob = self.hub.blobs / payload["oid"]
        if not blob.exists() or blob.stat().st_size != payload["size"]:
            return self._error(404, "EntryNotFound", "LFS object missing")
        self._send(200, {})

    def commit(self, repo_id, revision, query) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return None
        parent = self.hub.head(repo_id, revision)
        if parent is None:
            return self._error(404, "RevisionNotFound", f"revision {revision} not found")
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        header = lines[0]["value"]
        tree = dict(repo.trees[parent])
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file":
                data = base64.b64decode(value["content"])
                tree[value["path"]] = FileEntry(self.hub.store(data), len(data), lfs=False)
            elif key == "lfsFile":
                blob = self.hub.blobs / value["oid"]
                if not blob.exists():
                    return self._error(400, "BadRequest", f"LFS object {value['oid']} was not uploaded")
                tree[value["path"]] = FileEntry(value["oid"], blob.stat().st_size, lfs=True)
            elif key in ("deletedFile", "deletedFolder"):
                prefix = value["path"].rstrip("/") + "/"
                tree = {p: e for p, e in tree.items() if p != value["path"] and not p.startswith(prefix)}
            else:
                return self._error(400, "BadRequest", f"unsupported commit operation {key}")
        create_pr = query.get("create_pr") == ["1"]
        if not create_pr and revision not in repo.branches:
            return self._error(400, "BadRequest", "can only commit on top of a branch")
        if create_pr:
            repo.pulls += 1
        branch = f"refs/pr/{repo.pulls}" if create_pr else revision
        oid = self.hub.new_commit(repo, tree, parent, header["summary"])
        repo.branches[branch] = oid
        self.hub.commits.append(
            {
                "repo_id": repo_id,
                "revision": branch,
                "summary": header["summary"],
                "description": header.get("description", ""),
                "create_pr": create_pr,
                "files": {path: ("lfs" if e.lfs else "regular") for path, e in tree.items()},
                "oid": oid,
            }
        )
        pr_url = f"{self.hub.url}/{repo_id}/discussions/{repo.pulls}" if create_pr else None
        self._send(
            200,
            {
                "commitUrl": f"{self.hub.url}/{repo_id}/commit/{oid}",
                "commitOid": oid,
                "pullRequestUrl": pr_url,
            },
        )

    # -- download
    def resolve(self, repo_id, revision, filename, query, head_only=False) -> None:
        repo = self._repo(repo_id, head_only)
        if repo is None:
            return None
        oid = self.hub.head(repo_id, revision)
        if oid is None:
            return self._error(404, "RevisionNotFound", f"revision {revision} not found", head_only)
        entry = repo.trees[oid].get(filename)
        if entry is None:
            return self._error(
                404, "EntryNotFound", f"{filename} not found", head_only, **{"X-Repo-Commit": oid}
            )
        data = self.hub.read(entry.sha256)
        headers = {"ETag": f'"{entry.oid(data)}"', "X-Repo-Commit": oid}
        if entry.lfs:
            headers.update({"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)})
        self._send(200, data, {"Content-Type": "application/octet-stream", **headers}, head_only)

    def resolve_head(self, repo_id, revision, filename, query) -> None:
        self.resolve(repo_id, revision, filename, query, head_only=True)


_REPO = r"/([^/]+/[^/]+)"
_ROUTES = {
    "POST": [
        (r"/api/repos/create", _Handler.create_repo),
        (r"/api/validate-yaml", _Handler.validate_yaml),
        (rf"/api/models{_REPO}/branch/([^/]+)", _Handler.create_branch),
        (rf"/api/models{_REPO}/preupload/([^/]+)", _Handler.preupload),
        (rf"/api/models{_REPO}/commit/([^/]+)", _Handler.commit),
        (rf"{_REPO}\.git/info/lfs/objects/batch", _Handler.lfs_batch),
        (r"/lfs-verify", _Handler.lfs_verify),
    ],
    "PUT": [(r"/lfs-upload/([0-9a-f]{64})", _Handler.lfs_upload)],
    "GET": [
        (rf"/api/models{_REPO}", _Handler.repo_info),
        (rf"/api/models{_REPO}/revision/([^/]+)", _Handler.repo_info),
        (rf"{_REPO}/resolve/([^/]+)/(.+)", _Handler.resolve),
    ],
    "HEAD": [(rf"{_REPO}/resolve/([^/]+)/(.+)", _Handler.resolve_head)],
}
