"""How imagebuild reaches registries (`Connection`: one value, built once where a command's flags are
read, and handed down), and a session with one registry: reachability and TLS, authentication (auth.py
says who we are and how the registry asks for it), and what to do when it stumbles (retries with
exponential backoff on 5xx, 429, timeouts).
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import requests

from imagebuild import __version__
from imagebuild.common import Progress, quiet
from imagebuild.errors import EXIT_UNAVAILABLE, ImagebuildError
from imagebuild.registry.auth import (AuthFailed, Challenge, Credentials, RegistryError, find_credentials,
                                      login_hint, parse_www_authenticate, read_token, token_request)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
RETRY_ERRORS = (requests.ConnectionError, requests.Timeout)


class RegistryUnreachable(RegistryError):
    exit_code = EXIT_UNAVAILABLE


def is_loopback(registry: str) -> bool:
    host = registry[1:registry.find("]")] if registry.startswith("[") else registry.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def with_query(url: str, **params: str) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + list(params.items())
    return urlunsplit(parts._replace(query=urlencode(query)))


def describe(response: requests.Response) -> str:
    """`HTTP 400 DIGEST_INVALID: …` from a registry's error reply."""
    text = f"HTTP {response.status_code}"
    try:
        errors = response.json().get("errors") or []
        text += "".join(f" {e.get('code', '')}: {e.get('message', '')}" for e in errors[:3])
    except (ValueError, AttributeError, TypeError):
        text += f" {response.text[:200]}" if response.text else ""
    return text


@dataclass(frozen=True)
class Connection:
    """How to reach registries: the CA that signed their certificates (--ca-cert; else $REQUESTS_CA_BUNDLE,
    $SSL_CERT_FILE, the system's), plain HTTP (--insecure-http, only to a registry on this machine), who we
    are (credentials; None: found for each registry by auth.find_credentials), and how hard to retry.
    The host is the reference's: one build reaches its --registry and its --cache-* hosts the same way."""
    ca_cert: str | Path | None = None
    insecure_http: bool = False
    credentials: Credentials | None = None
    retries: int = 5
    backoff: float = 0.5

    def open(self, registry: str, scopes: Sequence[str] = (), progress: Progress = quiet) -> RegistryClient:
        """A session with the registry at host[:port], checked to answer and authenticated for `scopes`."""
        client = RegistryClient(registry, self, progress=progress)
        client.ping(scopes)
        return client


class RegistryClient:
    """One registry: reachability, authentication (Basic or Bearer) and retries with backoff."""

    def __init__(self, registry: str, connection: Connection = Connection(), *,
                 timeout: tuple[float, float] = (15, 300), progress: Progress = quiet):
        if connection.insecure_http and not is_loopback(registry):
            raise ImagebuildError(f"--insecure-http is only for a registry on this machine "
                                  f"(localhost, 127.0.0.1, ::1), not {registry}: give its CA with "
                                  f"--ca-cert")
        self.registry = registry
        self.base = f"{'http' if connection.insecure_http else 'https'}://{registry}"
        credentials = connection.credentials
        self.credentials = credentials if credentials is not None else find_credentials(registry)
        self.retries, self.backoff, self.timeout, self.progress = (connection.retries, connection.backoff, timeout,
                                                                   progress)
        self.session = requests.Session()
        self.session.headers["User-Agent"] = f"imagebuild/{__version__}"
        self.session.trust_env = not is_loopback(registry)  # no proxy between us and this machine
        ca_cert = connection.ca_cert
        self.session.verify = str(ca_cert) if ca_cert else (
            os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("SSL_CERT_FILE") or True)
        self.scopes: list[str] = []
        self.retried = 0
        self._authorization = (f"Bearer {self.credentials.registry_token}"
                               if self.credentials.registry_token else None)

    def url(self, path_or_url: str) -> str:
        return urljoin(self.base + "/", path_or_url)

    def wait(self, attempt: int, response: requests.Response | None, why: str) -> None:
        delay = min(30.0, self.backoff * 2 ** attempt)
        after = response.headers.get("Retry-After", "") if response is not None else ""
        if after.isdigit():
            delay = max(delay, min(float(after), 60.0))
        self.retried += 1
        self.progress(f"{self.registry}: {why}; retrying in {delay:.1f} s")
        time.sleep(delay)

    def unreachable(self, err: Exception) -> RegistryUnreachable:
        reason = str(err)
        if isinstance(err, requests.exceptions.SSLError):
            if "WRONG_VERSION_NUMBER" in reason.upper() or "record layer" in reason:
                return RegistryUnreachable(
                    f"{self.registry} does not speak TLS; a plain-HTTP registry on this machine "
                    f"needs --insecure-http")
            return RegistryUnreachable(
                f"TLS verification of {self.registry} failed ({reason[-160:]}): give the CA that "
                f"signed its certificate with --ca-cert PATH (or SSL_CERT_FILE / REQUESTS_CA_BUNDLE)")
        return RegistryUnreachable(f"cannot reach the registry at {self.base} "
                                   f"({type(err).__name__}: {reason[-200:]})")

    def _send(self, method: str, url: str, body, headers: dict | None) -> requests.Response:
        headers = dict(headers or {})
        if self._authorization and urlsplit(url).netloc == urlsplit(self.base).netloc:
            headers["Authorization"] = self._authorization  # never to an upload URL elsewhere
        data = body() if callable(body) else body
        return self.session.request(method, url, data=data, headers=headers, timeout=self.timeout,
                                    allow_redirects=method in ("GET", "HEAD"))

    def request(self, method: str, url: str, *, body=None, headers: dict | None = None,
                retry: bool = True) -> requests.Response:
        """Send, answering one 401 challenge; with retry, 5xx/429/timeouts are retried with backoff.

        `body` is bytes or a function returning a fresh body, so a request can be sent again."""
        url = self.url(url)
        attempt = 0
        while True:
            try:
                response = self._send(method, url, body, headers)
                if response.status_code == 401:
                    self._answer(response)
                    response = self._send(method, url, body, headers)
                    if response.status_code == 401:
                        raise self._rejected()
            except RETRY_ERRORS as err:
                if not retry or attempt >= self.retries:
                    raise self.unreachable(err) if retry else err
                self.wait(attempt, None, f"{type(err).__name__} on {method}")
                attempt += 1
                continue
            if retry and response.status_code in RETRY_STATUS and attempt < self.retries:
                self.wait(attempt, response, f"HTTP {response.status_code} on {method}")
                attempt += 1
                continue
            if response.status_code == 403:
                raise AuthFailed(f"{self.registry} denied {method} {urlsplit(url).path} "
                                 f"({describe(response)}) for {self._who()}: check that these "
                                 f"credentials may push there, or {login_hint(self.registry)}")
            return response

    def _who(self) -> str:
        c = self.credentials
        return "anonymous" if c.anonymous else f"{c.username or 'the token'} (from {c.source})"

    def _rejected(self) -> AuthFailed:
        if self.credentials.anonymous:
            return AuthFailed(f"{self.registry} needs credentials to push: {login_hint(self.registry)}")
        return AuthFailed(f"{self.registry} rejected the credentials of {self._who()} (wrong, or "
                          f"without the right to push there): {login_hint(self.registry)}")

    def _answer(self, response: requests.Response) -> None:
        """Turn a 401's challenge into an Authorization header, or raise AuthFailed."""
        challenges = parse_www_authenticate(response.headers.get("WWW-Authenticate", ""))
        creds = self.credentials
        for challenge in challenges:
            if challenge.scheme == "bearer" and not creds.registry_token:
                self._authorization = f"Bearer {self._token(challenge)}"
                return
            if challenge.scheme == "basic" and (creds.username or creds.password):
                self._authorization = requests.auth._basic_auth_str(creds.username, creds.password)
                return
        raise self._rejected()

    def _token(self, challenge: Challenge) -> str:
        self.scopes = list(dict.fromkeys(self.scopes + challenge.scopes))
        request = token_request(challenge, self.scopes, self.credentials)
        for attempt in range(self.retries + 1):
            try:
                reply = self.session.request(**request, timeout=self.timeout)
            except RETRY_ERRORS as err:
                if attempt == self.retries:
                    raise RegistryUnreachable(f"cannot reach the token service {request['url']} of "
                                              f"{self.registry} ({type(err).__name__})") from None
                self.wait(attempt, None, f"token service: {type(err).__name__}")
                continue
            if reply.status_code in RETRY_STATUS and attempt < self.retries:
                self.wait(attempt, reply, f"token service: HTTP {reply.status_code}")
                continue
            break
        if reply.status_code in (401, 403):
            raise self._rejected()
        token = read_token(reply.text) if reply.ok else None
        if token is None:
            raise RegistryError(f"the token service {request['url']} of {self.registry} gave no "
                                f"token ({describe(reply)})")
        return token

    def ping(self, scopes: Sequence[str] = ()) -> None:
        """Check that a registry answers at /v2/, then authenticate for `scopes` up front."""
        self.scopes = list(dict.fromkeys([*self.scopes, *scopes]))
        try:
            response = self._send("GET", self.url("/v2/"), None, None)
        except RETRY_ERRORS as err:
            raise self.unreachable(err) from None
        if response.status_code == 400 and "HTTPS server" in response.text:
            raise RegistryUnreachable(f"{self.registry} speaks TLS, not plain HTTP: drop "
                                      f"--insecure-http (and give its CA with --ca-cert if needed)")
        if response.status_code == 401:
            self._answer(response)
            response = self.request("GET", "/v2/")
        if response.status_code != 200:
            raise RegistryError(f"{self.base}/v2/ answered {describe(response)}: not an OCI registry?")
