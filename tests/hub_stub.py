"""A loopback stand-in for the Hub's HTTP API (not a test module): the few routes that
huggingface_hub's create_repo and upload_folder call (create, validate-yaml, preupload, commit),
answered on 127.0.0.1 with every file as a regular (non-LFS) blob, so pushes are checked by the
files that arrive and nothing leaves the machine."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

import pytest
from huggingface_hub import constants

AGENT_REGISTRY = "/api/agent-harnesses"
REPO_ROUTE = re.compile(r"^/api/(?P<type>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)/(?P<action>preupload|commit)/(?P<rev>[^/?]+)")


@dataclass
class Repo:
    type: str
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)


class HubStub:
    """Start with `with HubStub() as hub:`; point huggingface_hub at `hub.url`."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization header
        self.unknown: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stub.requests.append(("POST", self.path, self.headers.get("Authorization")))
                status, answer = stub.answer(self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def pushes(self) -> list[tuple[str, str, str | None]]:
        """The requests a push made: all but huggingface_hub's daily fetch of its agent registry
        (`/api/agent-harnesses`, answered 404 here), which any call may start."""
        return [request for request in self.requests if request[1] != AGENT_REGISTRY]

    def __enter__(self) -> Self:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, path: str, body: bytes) -> tuple[int, dict]:
        if path == "/api/repos/create":
            request = json.loads(body)
            repo_id = f"{request['organization']}/{request['name']}" if request.get("organization") else request["name"]
            kind = request.get("type") or "model"
            url = f"{self.url}/{'' if kind == 'model' else f'{kind}s/'}{repo_id}"
            if repo_id in self.repos:  # create_repo(exist_ok=True) reads the url of a 409 too
                return 409, {"error": "You already created this repo", "url": url}
            private = request.get("visibility") == "private" or request.get("private") is True  # 2.x: visibility
            self.repos[repo_id] = Repo(kind, private)
            return 200, {"url": url, "name": repo_id}
        if path == "/api/validate-yaml":
            return 200, {"errors": [], "warnings": []}
        match = REPO_ROUTE.match(path)
        if match and match["repo"] in self.repos:
            repo = self.repos[match["repo"]]
            if match["action"] == "preupload":
                files = json.loads(body)["files"]
                return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                                       for f in files]}
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            for line in lines:
                if line["key"] == "file":
                    repo.files[line["value"]["path"]] = base64.b64decode(line["value"]["content"])
            oid = hashlib.sha1(body).hexdigest()
            repo.commits.append(next(line["value"]["summary"] for line in lines if line["key"] == "header"))
            return 200, {"commitUrl": f"{self.url}/{match['repo']}/commit/{oid}", "commitOid": oid, "success": True}
        self.unknown.append(path)
        return 404, {"error": f"the stand-in Hub does not answer {path}"}


@pytest.fixture
def hub(monkeypatch):
    """A started stand-in, with huggingface_hub's endpoint (HF_ENDPOINT) and a token (HF_TOKEN)
    pointing at it; import it into a test module to use it."""
    with HubStub() as stub:
        monkeypatch.setenv("HF_ENDPOINT", stub.url)
        monkeypatch.setattr(constants, "ENDPOINT", stub.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setenv("HF_TOKEN", "hf_stand_in_token")
        yield stub
