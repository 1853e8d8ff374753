"""A session with one registry: who we are to it (credentials from the environment, the docker
config or a credential helper), how it asks for that (WWW-Authenticate: Basic, or Bearer with a token
service), and what to do when it stumbles (retries with exponential backoff on 5xx, 429, timeouts).

The parsers here read text a registry or a user's machine hands us: each returns a value or raises
a typed error, never a traceback.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

import requests

from imagebuild import __version__
from imagebuild.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_UNAVAILABLE,
    ImagebuildError,
)

Progress = Callable[[str], None]
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
RETRY_ERRORS = (requests.ConnectionError, requests.Timeout)

ENV_USER = "IMAGEBUILD_REGISTRY_USER"
ENV_PASSWORD = "IMAGEBUILD_REGISTRY_PASSWORD"
ENV_TOKEN = "IMAGEBUILD_REGISTRY_TOKEN"


class RegistryError(ImagebuildError):
    """The registry refused or broke the push; nothing was tagged."""

    exit_code = EXIT_FAILED


class AuthFailed(RegistryError):
    """Missing or wrong credentials, or no right to push there."""

    exit_code = EXIT_BAD_INPUT


class RegistryUnreachable(RegistryError):
    exit_code = EXIT_UNAVAILABLE


class CredentialsError(ImagebuildError):
    """A docker config or credential helper that cannot be read as given."""


def login_hint(registry: str) -> str:
    return (f"log in with `docker login {registry}` (it writes ~/.docker/config.json), or set "
            f"{ENV_USER} and {ENV_PASSWORD} (or {ENV_TOKEN} for a registry token)")


# ---------------------------------------------------------------- WWW-Authenticate

@dataclass(frozen=True)
class Challenge:
    scheme: str  # lower case: "basic", "bearer"
    params: dict = field(default_factory=dict)  # names lower case

    @property
    def scopes(self) -> list[str]:
        return self.params.get("scope", "").split()


_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[^"\\]|\\.)*"?'
_SCHEME = re.compile(rf"[\s,]*({_TOKEN})")
_PARAM = re.compile(rf"[\s,]*({_TOKEN})[ \t]*=[ \t]*({_QUOTED}|{_TOKEN})?", re.DOTALL)


def _unquote(value: str) -> str:
    if value.startswith('"'):
        value = value[1:-1] if len(value) > 1 and value.endswith('"') else value[1:]
        return re.sub(r"\\(.)", r"\1", value, flags=re.DOTALL)
    return value


def parse_www_authenticate(header: str) -> list[Challenge]:
    """`Bearer realm="…",service="…",scope="…"` and the like, several challenges allowed (RFC 9110)."""
    challenges: list[Challenge] = []
    pos = 0
    while pos < len(header):
        scheme = _SCHEME.match(header, pos)
        if not scheme:
            pos += 1  # skip what no grammar allows and keep reading
            continue
        pos = scheme.end()
        params = {}
        while param := _PARAM.match(header, pos):
            params[param.group(1).lower()] = _unquote(param.group(2) or "")
            pos = param.end()
        challenges.append(Challenge(scheme.group(1).lower(), params))
    return challenges


def parse_upload_range(header: str | None) -> int | None:
    """Bytes the registry holds for an upload, from its `Range: 0-<last byte>` reply; None if unreadable."""
    match = re.fullmatch(r"\s*(?:bytes=)?0-(\d{1,19})\s*", header or "")
    if not match:
        return None
    last = int(match.group(1))
    return last + 1 if last > 0 else 0  # distribution writes 0-0 for an empty upload


# ---------------------------------------------------------------- credentials

@dataclass(frozen=True)
class Credentials:
    username: str = ""
    password: str = ""
    identity_token: str = ""  # an OAuth2 refresh token (docker config `identitytoken`)
    registry_token: str = ""  # a bearer token sent as is
    source: str = "anonymous"

    @property
    def anonymous(self) -> bool:
        return not (self.username or self.password or self.identity_token or self.registry_token)


@dataclass(frozen=True)
class DockerConfig:
    auths: dict = field(default_factory=dict)  # registry host -> Credentials
    cred_helpers: dict = field(default_factory=dict)  # registry host -> helper suffix
    creds_store: str = ""


def registry_key(server: str) -> str:
    """`https://host:5000/v1/` -> `host:5000`: docker config keys come in several spellings."""
    key = re.sub(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", "", server.strip())
    return key.split("/", 1)[0].lower()


def decode_auth(value: str, where: str) -> tuple[str, str]:
    try:
        text = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise CredentialsError(f"{where}: `auth` is not base64 of `user:password`") from None
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise CredentialsError(f"{where}: `auth` decodes to no `user:password` pair")
    return user, password


def _text(entry: Mapping, key: str, where: str) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str):
        raise CredentialsError(f"{where}: `{key}` should be a string, not {type(value).__name__}")
    return value


def parse_docker_config(text: str, path: str = "config.json") -> DockerConfig:
    """The parts of a docker client config that say how to authenticate; raises CredentialsError."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise CredentialsError(f"{path} is not JSON ({err}); fix or remove it") from None
    if not isinstance(data, dict):
        raise CredentialsError(f"{path} should hold a JSON object")
    auths: dict[str, Credentials] = {}
    raw_auths = data.get("auths") or {}
    if not isinstance(raw_auths, dict):
        raise CredentialsError(f"{path}: `auths` should map registry hosts to entries")
    for server, entry in raw_auths.items():
        where = f"{path}: auths[{server!r}]"
        if not isinstance(entry, dict):
            raise CredentialsError(f"{where} should be an object")
        user, password = _text(entry, "username", where), _text(entry, "password", where)
        if _text(entry, "auth", where):
            user, password = decode_auth(entry["auth"], where)
        creds = Credentials(user, password, _text(entry, "identitytoken", where),
                            _text(entry, "registrytoken", where), source=path)
        if not creds.anonymous:  # an empty entry is a placeholder beside credsStore
            auths[registry_key(server)] = creds
    helpers = data.get("credHelpers") or {}
    if not isinstance(helpers, dict) or not all(isinstance(v, str) for v in helpers.values()):
        raise CredentialsError(f"{path}: `credHelpers` should map registry hosts to helper names")
    store = data.get("credsStore") or ""
    if not isinstance(store, str):
        raise CredentialsError(f"{path}: `credsStore` should be a helper name")
    return DockerConfig(auths, {registry_key(k): v for k, v in helpers.items()}, store)


def docker_config_path(env: Mapping[str, str] = os.environ) -> Path:
    root = env.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    return Path(root) / "config.json"


def run_credential_helper(helper: str, registry: str) -> Credentials | None:
    """The docker-credential-HELPER protocol: `get` with the host on stdin, JSON on stdout."""
    program = shutil.which(f"docker-credential-{helper}")
    if program is None:
        raise CredentialsError(f"the docker config names credential helper {helper!r} for {registry}, "
                               f"but docker-credential-{helper} is not on PATH")
    for server in (registry, f"https://{registry}"):
        try:
            proc = subprocess.run([program, "get"], input=server, capture_output=True, text=True, check=False,
                                  timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise CredentialsError(f"docker-credential-{helper} failed: {err}") from None
        if proc.returncode != 0:
            continue  # "credentials not found": try the other spelling, then give up
        try:
            data = json.loads(proc.stdout)
            user, secret = data.get("Username") or "", data.get("Secret") or ""
        except (json.JSONDecodeError, AttributeError):
            raise CredentialsError(f"docker-credential-{helper} printed no credentials JSON") from None
        if not isinstance(user, str) or not isinstance(secret, str):
            raise CredentialsError(f"docker-credential-{helper} printed a non-string Username/Secret")
        source = f"docker-credential-{helper}"
        if user == "<token>":
            return Credentials(identity_token=secret, source=source)
        return Credentials(user, secret, source=source)
    return None


def find_credentials(registry: str, env: Mapping[str, str] = os.environ) -> Credentials:
    """Environment first (what CI sets), then the docker config's helper, entry, or store."""
    if env.get(ENV_TOKEN):
        return Credentials(registry_token=env[ENV_TOKEN], source=ENV_TOKEN)
    if env.get(ENV_USER) or env.get(ENV_PASSWORD):
        return Credentials(env.get(ENV_USER, ""), env.get(ENV_PASSWORD, ""),
                           source=f"{ENV_USER}/{ENV_PASSWORD}")
    path = docker_config_path(env)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Credentials()
    except (OSError, UnicodeDecodeError) as err:
        raise CredentialsError(f"cannot read {path}: {err}") from None
    config = parse_docker_config(text, str(path))
    key = registry_key(registry)
    if key in config.cred_helpers:
        return run_credential_helper(config.cred_helpers[key], key) or Credentials()
    if key in config.auths:
        return config.auths[key]
    if config.creds_store:
        return run_credential_helper(config.creds_store, key) or Credentials()
    return Credentials()


# ---------------------------------------------------------------- bearer tokens

def token_request(challenge: Challenge, scopes: list[str], creds: Credentials) -> dict:
    """The request (keyword arguments for requests) that asks the challenge's realm for a token."""
    realm = challenge.params.get("realm", "")
    if not realm.startswith(("http://", "https://")):
        raise RegistryError(f"the registry asked for a Bearer token but named no usable realm "
                            f"({realm!r})")
    service = challenge.params.get("service", "")
    if creds.identity_token:  # OAuth2 refresh-token grant, as docker does with `identitytoken`
        form = {"grant_type": "refresh_token", "refresh_token": creds.identity_token,
                "client_id": "imagebuild", "scope": " ".join(scopes)}
        if service:
            form["service"] = service
        return {"method": "POST", "url": realm, "data": form}
    params = ([("service", service)] if service else []) + [("scope", s) for s in scopes]
    request = {"method": "GET", "url": realm, "params": params}
    if creds.username or creds.password:
        request["auth"] = (creds.username, creds.password)
    return request


def read_token(body: str) -> str | None:
    """`token` (or OAuth2's `access_token`) from a token service's JSON reply."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    token = data.get("token") or data.get("access_token")
    return token if isinstance(token, str) and token else None


# ---------------------------------------------------------------- talking to a registry

def _quiet(_: str) -> None:
    pass


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


class RegistryClient:
    """One registry: reachability, authentication (Basic or Bearer) and retries with backoff."""

    def __init__(self, registry: str, *, credentials: Credentials | None = None,
                 ca_cert: str | Path | None = None, insecure_http: bool = False, retries: int = 5,
                 backoff: float = 0.5, timeout: tuple[float, float] = (15, 300),
                 progress: Progress = _quiet):
        if insecure_http and not is_loopback(registry):
            raise ImagebuildError(f"--insecure-http is only for a registry on this machine "
                                  f"(localhost, 127.0.0.1, ::1), not {registry}: give its CA with "
                                  f"--ca-cert")
        self.registry = registry
        self.base = f"{'http' if insecure_http else 'https'}://{registry}"
        self.credentials = credentials if credentials is not None else find_credentials(registry)
        self.retries, self.backoff, self.timeout, self.progress = retries, backoff, timeout, progress
        self.session = requests.Session()
        self.session.headers["User-Agent"] = f"imagebuild/{__version__}"
        self.session.trust_env = not is_loopback(registry)  # no proxy between us and this machine
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
