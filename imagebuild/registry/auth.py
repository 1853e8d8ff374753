"""Who we are to a registry (credentials from the environment, the docker config or a credential
helper) and how it asks for that (WWW-Authenticate: Basic, or Bearer with a token service).
client.py holds the session that uses them.

The parsers here read text a registry or a user's machine hands us: each returns a value or raises
a typed error, never a traceback.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from imagebuild.errors import EXIT_BAD_INPUT, EXIT_FAILED, ImagebuildError

ENV_USER = "IMAGEBUILD_REGISTRY_USER"
ENV_PASSWORD = "IMAGEBUILD_REGISTRY_PASSWORD"
ENV_TOKEN = "IMAGEBUILD_REGISTRY_TOKEN"


class RegistryError(ImagebuildError):
    """The registry refused or broke the push; nothing was tagged."""

    exit_code = EXIT_FAILED


class AuthFailed(RegistryError):
    """Missing or wrong credentials, or no right to push there."""

    exit_code = EXIT_BAD_INPUT


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
