"""Real registries for tests, on 127.0.0.1 only: Debian's docker-registry (distribution 2.8) with a
config written here, a token service for its Bearer flow, certificates made with openssl, and a TCP
proxy that counts the bytes sent through it and can cut one connection or answer once with an error.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import requests

TOOLS = {"docker-registry": "docker-registry", "skopeo": "skopeo", "htpasswd": "apache2-utils",
         "openssl": "openssl"}


def missing_tools() -> list[str]:
    return [f"{tool} (apt-get install -y {package})" for tool, package in TOOLS.items()
            if shutil.which(tool) is None]


def require_tools() -> None:
    """A registry test that cannot run here says which tools it lacks (and fails under CI)."""
    from tests.conftest import cannot_run  # conftest imports this module
    missing = missing_tools()
    if missing:
        cannot_run("registry tests need " + ", ".join(missing), "scripts/host.sh installs them")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*command: str, text: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run a tool; a failure shows its stderr."""
    proc = subprocess.run(command, capture_output=True, text=text, check=False, **kwargs)
    if proc.returncode != 0:
        stderr = proc.stderr if text else proc.stderr.decode(errors="replace")
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {stderr[-2000:]}")
    return proc


# ---------------------------------------------------------------- certificates

@dataclass(frozen=True)
class Tls:
    ca: Path  # the CA certificate a client should trust
    cert: Path  # the server's certificate (SAN 127.0.0.1, localhost)
    key: Path


def make_tls(folder: Path) -> Tls:
    """A throwaway CA and a server certificate it signed, for 127.0.0.1."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    cert, key, csr = folder / "server.crt", folder / "server.key", folder / "server.csr"
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
        "/CN=imagebuild test CA", "-keyout", str(ca_key), "-out", str(ca),
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", str(key), "-out", str(csr))
    extensions = folder / "server.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                          "extendedKeyUsage=serverAuth\n")
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-out", str(cert), "-extfile", str(extensions))
    return Tls(ca, cert, key)


# ---------------------------------------------------------------- the token service

class TokenService:
    """The Bearer flow's other half: checks Basic credentials, returns a JWT (RS256, x5c header)
    granting what was asked, signed by a key whose certificate the registry trusts."""

    issuer = "imagebuild-test-issuer"
    service = "imagebuild-test-registry"

    def __init__(self, folder: Path, users: dict[str, str]):
        folder.mkdir(parents=True, exist_ok=True)
        self.key, self.cert = folder / "token.key", folder / "token.crt"
        run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=imagebuild test token signer", "-keyout", str(self.key), "-out", str(self.cert))
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert), "-outform", "DER"],
                             check=True, capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        self.users = users
        self.requests: list[dict] = []  # what each token request asked for, for tests to read
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_GET(self):
                query = parse_qs(urlsplit(self.path).query)
                user = service.check(self.headers.get("Authorization", ""))
                service.requests.append({"user": user, "scope": query.get("scope", [])})
                if user is None:
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"token": service.sign(user, query.get("scope", [])),
                                   "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def check(self, header: str) -> str | None:
        if not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return None
        return user if self.users.get(user) == password else None

    def sign(self, user: str, scopes: list[str]) -> str:
        access = []
        for scope in " ".join(scopes).split():
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": user, "aud": self.service, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": uuid.uuid4().hex, "access": access}
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        b64 = lambda d: base64.urlsafe_b64encode(d).rstrip(b"=").decode()
        signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)],
                                   input=signing_input.encode(), check=True,
                                   capture_output=True).stdout
        return f"{signing_input}.{b64(signature)}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------- the registry

@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT, as a reference names it
    url: str
    storage: Path
    process: subprocess.Popen
    log: Path
    ca: Path | None = None
    users: dict = field(default_factory=dict)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def skopeo_flags(self, user: str | None = None) -> list[str]:
        """How skopeo, an independent client, reaches this registry."""
        flags = []
        if self.ca:
            certs = self.ca.parent / "skopeo-certs"
            certs.mkdir(exist_ok=True)
            shutil.copy(self.ca, certs / "ca.crt")
            flags.append(f"--cert-dir={certs}")
        else:
            flags.append("--tls-verify=false")
        if user:
            flags.append(f"--creds={user}:{self.users[user]}")
        return flags

    def blob_gets_since(self, offset: int, blobs) -> dict[str, list[tuple[int, int]]]:
        """blob_gets over what the access log says after `offset` (its size before the requests in question)."""
        with open(self.log, "rb") as handle:
            handle.seek(offset)
            return blob_gets(handle.read().decode(errors="replace"), blobs)


# docker-registry's access log (combined format): the request line, the status, the body bytes.
ACCESS = re.compile(r'"GET /v2/\S+/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" (200|206) (\d+)')


def blob_gets(log_text: str, blobs) -> dict[str, list[tuple[int, int]]]:
    """(status, bytes) of every GET of each of `blobs` (digests) in an access-log excerpt."""
    seen: dict[str, list[tuple[int, int]]] = {digest: [] for digest in blobs}
    for digest, status, size in ACCESS.findall(log_text):
        if digest in seen:
            seen[digest].append((int(status), int(size)))
    return seen


def start_registry(folder: Path, *, users: dict[str, str] | None = None, tls: Tls | None = None,
                   token: TokenService | None = None) -> Registry:
    """docker-registry on a free loopback port with its own storage; Basic auth (bcrypt htpasswd)
    when `users` is given, Bearer tokens from `token` when that is."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(folder / "storage")},
                    "delete": {"enabled": True}, "maintenance": {"uploadpurging": {"enabled": False}}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": uuid.uuid4().hex,
                 "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }
    if users and not token:
        htpasswd = folder / "htpasswd"
        for n, (user, password) in enumerate(users.items()):
            run("htpasswd", "-B", "-b", *(["-c"] if n == 0 else []), str(htpasswd), user, password)
        config["auth"] = {"htpasswd": {"realm": "imagebuild-test", "path": str(htpasswd)}}
    if token:
        config["auth"] = {"token": {"realm": token.realm, "service": token.service,
                                    "issuer": token.issuer, "rootcertbundle": str(token.cert)}}
    if tls:
        config["http"]["tls"] = {"certificate": str(tls.cert), "key": str(tls.key)}
    config_path = folder / "config.yml"
    config_path.write_text(json.dumps(config, indent=2))  # YAML reads JSON
    log = folder / "registry.log"
    process = subprocess.Popen(["docker-registry", "serve", str(config_path)],
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    scheme = "https" if tls else "http"
    registry = Registry(f"127.0.0.1:{port}", f"{scheme}://127.0.0.1:{port}", folder / "storage",
                        process, log, tls.ca if tls else None, dict(users or {}))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {log.read_text()[-2000:]}")
        try:
            requests.get(f"{registry.url}/v2/", timeout=1, verify=str(tls.ca) if tls else True)
            return registry
        except requests.RequestException:
            time.sleep(0.1)
    registry.stop()
    raise RuntimeError(f"docker-registry did not answer: {log.read_text()[-2000:]}")


@contextmanager
def serving(folder: Path, **options) -> Iterator[Registry]:
    """start_registry for one test or fixture: the tools checked first, the server stopped after."""
    require_tools()
    server = start_registry(folder, **options)
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- a proxy that misbehaves once

class Proxy:
    """TCP from 127.0.0.1:port to the registry, counting the bytes clients send upstream.

    Armed with a fault, at the `occurrence`-th time `pattern` appears in what clients send, it
    either forwards `after` more bytes then cuts both connections (`cut`), or answers `status`
    itself and closes (`status`). Each fault fires once."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.host = f"127.0.0.1:{self.port}"
        self.sent_upstream = 0
        self.fault: dict | None = None
        self.fired = False
        self.seen = 0
        self.lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, pattern: bytes, occurrence: int = 1, *, after: int = 0,
             status: int | None = None) -> None:
        with self.lock:
            self.fault = {"pattern": pattern, "occurrence": occurrence, "after": after,
                          "status": status}
            self.fired, self.seen = False, 0

    def reset_count(self) -> None:
        with self.lock:
            self.sent_upstream = 0

    def close(self) -> None:
        self.closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    def _trigger(self, window: bytes) -> int | None:
        """Where in `window` the armed fault fires, if it does."""
        with self.lock:
            if self.fault is None or self.fired:
                return None
            start = 0
            while (found := window.find(self.fault["pattern"], start)) >= 0:
                self.seen += 1
                if self.seen == self.fault["occurrence"]:
                    self.fired = True
                    return found
                start = found + 1
            return None

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        tail, countdown = b"", None
        try:
            while data := client.recv(1 << 16):
                if countdown is None and (self.fault and not self.fired):
                    keep = len(self.fault["pattern"]) - 1
                    where = self._trigger(tail + data)
                    if where is not None:
                        if self.fault["status"]:
                            reply = (f"HTTP/1.1 {self.fault['status']} Injected\r\nContent-Length: 0"
                                     f"\r\nRetry-After: 0\r\nConnection: close\r\n\r\n")
                            client.sendall(reply.encode())
                            return
                        countdown = max(0, where - len(tail) + self.fault["after"])
                    tail = (tail + data)[-keep:] if keep else b""
                if countdown is not None:
                    part = data[:countdown]
                    upstream.sendall(part)
                    self._count(len(part))
                    countdown -= len(part)
                    if countdown == 0:
                        return
                    continue
                upstream.sendall(data)
                self._count(len(data))
        except OSError:
            pass
        finally:
            _shut(client, upstream)
            client.close()
            upstream.close()

    def _count(self, n: int) -> None:
        with self.lock:
            self.sent_upstream += n

    def _down(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while data := upstream.recv(1 << 16):
                client.sendall(data)
        except OSError:
            pass
        finally:
            _shut(client, upstream)  # the upstream-bound thread closes them


def _shut(*sockets: socket.socket) -> None:
    """Both directions of a proxied connection end together."""
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
