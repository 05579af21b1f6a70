"""A local stand-in for the few Hugging Face Hub HTTP endpoints that ``create_repo``,
``create_branch`` and ``upload_folder`` use, so publishing is tested without the network.

Every request is recorded (method, path, headers, JSON or NDJSON body). The preupload answer puts
every file in ``regular`` upload mode, so file contents arrive base64-encoded inside the commit
payload (no LFS or Xet transfer to emulate).
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml


class FakeHub:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.repos: dict[str, dict] = {}
        self.commits: list[dict] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def _reply(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                record = {"method": "POST", "path": self.path, "headers": dict(self.headers), "raw": raw}
                hub.requests.append(record)
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:3] == ["api", "repos", "create"]:
                    body = json.loads(raw)
                    repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
                    hub.repos[repo_id] = {"visibility": body.get("visibility"), "private": body.get("private"), "branches": {"main"}}
                    return self._reply(200, {"url": f"{hub.endpoint}/{repo_id}", "name": repo_id})
                if parts[:2] == ["api", "validate-yaml"]:
                    # The real Hub rejects a card whose metadata is not YAML; so does this one.
                    content = json.loads(raw)["content"]
                    try:
                        yaml.safe_load(content.split("---")[1])
                    except (yaml.YAMLError, IndexError) as error:
                        return self._reply(400, {"errors": [{"message": f"invalid YAML metadata: {error}"}]})
                    return self._reply(200, {"errors": [], "warnings": []})
                if parts[0:2] == ["api", "models"] and "branch" in parts:
                    index = parts.index("branch")
                    repo_id = "/".join(parts[2:index])
                    hub.repos.setdefault(repo_id, {"branches": {"main"}})["branches"].add("/".join(parts[index + 1:]))
                    return self._reply(200, {})
                if parts[0:2] == ["api", "models"] and "preupload" in parts:
                    files = json.loads(raw)["files"]
                    return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]})
                if parts[0:2] == ["api", "models"] and "commit" in parts:
                    index = parts.index("commit")
                    lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
                    files = {
                        line["value"]["path"]: base64.b64decode(line["value"]["content"])
                        for line in lines if line["key"] == "file"
                    }
                    header = next(line["value"] for line in lines if line["key"] == "header")
                    hub.commits.append({
                        "repo_id": "/".join(parts[2:index]), "revision": "/".join(parts[index + 1:]),
                        "summary": header.get("summary"), "files": files,
                    })
                    return self._reply(200, {"commitUrl": f"{hub.endpoint}/{hub.commits[-1]['repo_id']}/commit/{'a' * 40}", "commitOid": "a" * 40, "pullRequestUrl": None})
                return self._reply(404, {"error": f"fake hub has no endpoint POST {self.path}"})

            def do_GET(self) -> None:
                hub.requests.append({"method": "GET", "path": self.path, "headers": dict(self.headers), "raw": b""})
                return self._reply(404, {"error": f"fake hub has no endpoint GET {self.path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
