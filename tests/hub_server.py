"""A real HTTP server on loopback speaking the part of the Hub API that `create_repo` + `upload_folder` use.

It stores every committed file, so tests check what actually arrived. Files are accepted as "regular" uploads
(base64 inside the NDJSON commit), which keeps LFS/Xet out of the exchange. Unknown endpoints answer 404 and are
recorded, so a huggingface_hub upgrade that needs more endpoints fails loudly.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHub:
    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.commits: list[tuple[str, str, list[str]]] = []  # (repo, message, paths)
        self.requests: list[tuple[str, str]] = []
        self.unknown: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.refuse_uploads = False  # set to answer uploads 403, as a Hub that revoked the token would
        self.stall_uploads = False  # set to read upload requests and never answer them, as a stalled server would
        self.trickle_uploads = False  # set to answer uploads one byte at a time, never finishing (a slow-loris Hub)
        self.stalled = 0  # requests left unanswered (stalled or trickled)
        self._release = threading.Event()  # set at stop: stalled handlers return and their threads end
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _json(self, status: int, payload, headers: dict | None = None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _trickle(self):
                """Headers promising a large body, then a byte every 0.2 s until the server stops: every read gets
                data in time, the response never ends."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                try:
                    while not hub._release.wait(0.2):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                except OSError:  # the client gave up
                    pass

            def _route(self, method: str):
                body = self._body()
                path = self.path.split("?")[0]
                with hub.lock:
                    hub.requests.append((method, path))
                parts = path.strip("/").split("/")
                if method == "POST" and path == "/api/repos/create":
                    request = json.loads(body)
                    repo = f"{request.get('organization') or 'tester'}/{request['name']}"
                    with hub.lock:
                        hub.repos.setdefault(repo, {})
                    return self._json(200, {"url": f"{hub.url}/{repo}", "name": repo, "id": repo})
                if hub.trickle_uploads and path != "/api/repos/create":
                    with hub.lock:
                        hub.stalled += 1
                    return self._trickle()
                if hub.stall_uploads and path != "/api/repos/create":
                    with hub.lock:
                        hub.stalled += 1
                    hub._release.wait()
                    return None
                if hub.refuse_uploads and path != "/api/repos/create":
                    return self._json(
                        403,
                        {"error": "Invalid credentials in Authorization header"},
                        {"X-Error-Message": "Invalid credentials in Authorization header"},
                    )
                if method == "POST" and path == "/api/validate-yaml":
                    import yaml

                    content = json.loads(body)["content"]
                    # The Hub checks the README's front matter (between the leading `---` lines).
                    front = content.split("---", 2)[1] if content.startswith("---") else ""
                    try:
                        yaml.safe_load(front)
                        errors = []
                    except yaml.YAMLError as err:
                        errors = [{"message": str(err)}]
                    return self._json(200 if not errors else 400, {"errors": errors, "warnings": []})
                if method == "POST" and len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "preupload":
                    files = json.loads(body)["files"]
                    return self._json(
                        200,
                        {
                            "files": [
                                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
                            ],
                            "commitOid": "0" * 40,
                        },
                    )
                if method == "POST" and len(parts) == 6 and parts[:2] == ["api", "models"] and parts[4] == "commit":
                    repo = f"{parts[2]}/{parts[3]}"
                    header, paths = {}, []
                    for line in body.decode().splitlines():
                        if not line.strip():
                            continue
                        item = json.loads(line)
                        if item["key"] == "header":
                            header = item["value"]
                        elif item["key"] == "file":
                            value = item["value"]
                            content = base64.b64decode(value["content"])
                            with hub.lock:
                                hub.repos.setdefault(repo, {})[value["path"]] = content
                            paths.append(value["path"])
                        elif item["key"] == "deletedFile":
                            with hub.lock:
                                hub.repos.get(repo, {}).pop(item["value"]["path"], None)
                    with hub.lock:
                        hub.commits.append((repo, header.get("summary", ""), paths))
                    oid = f"{len(hub.commits):040x}"
                    return self._json(200, {"commitUrl": f"{hub.url}/{repo}/commit/{oid}", "commitOid": oid})
                with hub.lock:
                    hub.unknown.append((method, path))
                return self._json(
                    404, {"error": f"not served by the test hub: {method} {path}"}, {"X-Error-Code": "EntryNotFound"}
                )

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_HEAD(self):
                self._route("HEAD")

            def do_PUT(self):
                self._route("PUT")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def stop(self):
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    def __exit__(self, *exc):
        if self.thread.is_alive():
            self.stop()


class SilentServer:
    """Accepts TCP connections on loopback and never answers a byte: a Hub that hangs rather than refuses."""

    def __init__(self):
        import socket

        self.socket = socket.create_server(("127.0.0.1", 0))
        self.socket.listen(16)  # connections complete in the kernel's backlog; nobody ever reads them
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"

    def __enter__(self) -> "SilentServer":
        return self

    def __exit__(self, *exc):
        self.socket.close()


class TricklingServer(SilentServer):
    """Answers every request with headers and then one byte every 0.2 s, forever: each read is quick, the response
    never ends (a per-read timeout alone never fires)."""

    def __init__(self):
        super().__init__()
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(connection,), daemon=True).start()

    def _trickle(self, connection):
        with connection:
            try:
                connection.recv(65536)
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
                )
                while not self._stop.wait(0.2):
                    connection.sendall(b" ")
            except OSError:
                pass

    def __exit__(self, *exc):
        self._stop.set()
        super().__exit__(*exc)
