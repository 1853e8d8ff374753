"""Recipe: the TOML a user writes, parsed and validated into plain typed values.

Every problem becomes one RecipeError naming the file, the key path, the line, and the fix.
The types come first, then `load_recipe` / `parse_recipe`, then one checker per table; the tables
that change installed distributions ([[patches]], [[prune]]) are edits.py's, [aot] is aot.py's.
docs/recipes.md documents the format.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from imagebuild.recipe.aot import AotSpec, parse_aot
from imagebuild.recipe.cuda import Arch, CudaVersion, parse_driver
from imagebuild.recipe.edits import Patch, Prune, distribution_name, parse_patches, parse_prune
from imagebuild.recipe.layers import LAYER_ORDER
from imagebuild.recipe.reader import Key, RecipeReader, parse_toml, read_source, show, toml_kind


@dataclass(frozen=True)
class DebianBase:
    """A Debian suite bootstrapped with mmdebstrap from exactly the .debs its lock names."""

    suite: str  # "bookworm"
    packages: tuple[str, ...] = ()  # extra Debian packages, sorted, deduplicated
    arch: str = "amd64"  # Debian architecture name
    suites: tuple[str, ...] = ()  # the apt suites packages come from; () means default_suites()
    components: tuple[str, ...] = ("main",)
    mirror: str | None = None  # archive root for every suite but *-security; None: the host's apt sources
    security_mirror: str | None = None  # archive root for *-security suites
    snapshot: str | None = None  # a snapshot service's root, tried for a .deb no mirror has any more
    keyring: str | None = None  # the keyring a mirror's InRelease is checked with; None: Debian's archive keyring

    @property
    def apt_suites(self) -> tuple[str, ...]:
        """Security fixes are pins like any other: the default takes updates and security too."""
        return self.suites or (self.suite, f"{self.suite}-updates", f"{self.suite}-security")


@dataclass(frozen=True)
class ImageBase:
    """An existing image pinned by digest: `repo@sha256:<64 hex>`."""

    ref: str
    python: str  # target Python major.minor inside that image, e.g. "3.11"
    glibc: str  # glibc major.minor inside that image, e.g. "2.36"
    python_path: str = "/usr/bin/python3"


@dataclass(frozen=True)
class PythonSpec:
    requirements: tuple[str, ...]  # PEP 508 strings as written
    constraints: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()  # canonical names dropped from the resolve
    extra_index_urls: tuple[str, ...] = ()
    exclude_newer: str | None = None  # RFC 3339 timestamp or date
    layers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # layer name -> name globs


@dataclass(frozen=True)
class CudaSpec:
    toolkit: CudaVersion
    archs: tuple[Arch, ...]
    min_driver: str  # oldest driver on the hosts the image must run on, "580.65.06"


@dataclass(frozen=True)
class SmokeSpec:
    """What the in-image smoke test does beyond its standard checks."""

    imports: tuple[str, ...] = ()  # modules imported (each in its own process) on a machine without a GPU
    accept_unknown: tuple[str, ...] = ()  # checks whose `unknown` may still tag the image, by name


@dataclass(frozen=True)
class PlatformSpec:
    """One platform of a multi-platform recipe: [platforms.<arch>]."""

    arch: str  # Debian architecture name: "amd64" | "arm64"
    cuda_archs: tuple[Arch, ...] | None = None  # GPU targets on this platform; None: [cuda].archs
    engine: str | None = None  # a Docker endpoint (DOCKER_HOST form) that builds it natively

    @property
    def name(self) -> str:
        """The OCI platform: linux/arm64."""
        return f"linux/{self.arch}"


@dataclass(frozen=True)
class Recipe:
    path: Path  # absolute path of the recipe file
    name: str  # image repository name
    tag: str
    base: DebianBase | ImageBase
    python: PythonSpec
    cuda: CudaSpec | None
    patches: tuple[Patch, ...] = ()
    prune: tuple[Prune, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    smoke: SmokeSpec = SmokeSpec()
    platforms: tuple[PlatformSpec, ...] = ()  # empty: one platform, [base].arch
    aot: AotSpec | None = None  # the serving shapes whose kernels the image ships prebuilt (aot.py)

    @property
    def stem(self) -> str:
        """The lock's file name stem: recipes/cuda-toolchain.toml -> cuda-toolchain."""
        return self.path.stem

    @property
    def multi_platform(self) -> bool:
        return bool(self.platforms)

    def platform(self, arch: str) -> PlatformSpec:
        for spec in self.platforms:
            if spec.arch == arch:
                return spec
        raise KeyError(arch)

    def for_platform(self, arch: str) -> "Recipe":
        """The single-platform recipe one platform of this one builds: its base arch and GPU targets."""
        spec = self.platform(arch)
        cuda = self.cuda
        if cuda is not None and spec.cuda_archs is not None:
            cuda = replace(cuda, archs=spec.cuda_archs)
        return replace(self, base=replace(self.base, arch=arch), cuda=cuda, platforms=(),
                       prune=tuple(entry for entry in self.prune if entry.applies_to(arch)))


DEBIAN_ARCHS = ("amd64", "arm64")
# The suites knowledge/compat.toml has facts for (Python, glibc); tests/knowledge/test_facts.py keeps them equal.
DEBIAN_SUITES = ("bullseye", "bookworm", "trixie")

_TOP_KEYS = ("image", "base", "python", "cuda", "patches", "prune", "env", "labels", "smoke", "platforms",
              "aot")
_PLATFORM_KEYS = ("cuda_archs", "engine")
_ENGINE_SCHEMES = ("unix", "tcp", "ssh")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_IMAGE_KEYS = ("name", "tag")
_DEBIAN_KEYS = ("debian", "packages", "arch", "suites", "components", "mirror", "security_mirror", "snapshot",
                "keyring")
_IMAGE_BASE_KEYS = ("image", "python", "glibc", "python_path")
_PYTHON_KEYS = ("requirements", "constraints", "exclude", "extra_index_urls", "exclude_newer", "layers")
_CUDA_KEYS = ("toolkit", "archs", "min_driver")

# Docker reference grammar (distribution/reference): [registry[:port]/]component(/component)*
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_REGISTRY = re.compile(rf"{_HOST}(?:\.{_HOST})*(?::[0-9]+)?")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")

_SUITE = re.compile(r"[a-z]+")
_DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_MAJOR_MINOR = re.compile(r"\d{1,3}\.\d{1,3}")
_NAME_GLOB = re.compile(r"[A-Za-z0-9._*?!\[\]-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ANY_KEY = re.compile(r".+", re.DOTALL)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[Tt ](\d{2}:\d{2}:\d{2}(?:\.\d+)?)([Zz]|[+-]\d{2}:\d{2})")


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe file; every problem raises one RecipeError."""
    return parse_recipe(read_source(Path(path)), Path(path))


def parse_recipe(text: str, path: Path) -> Recipe:
    """Validate recipe source; `path` names the file in errors and anchors relative patch files."""
    path = Path(path)
    doc = parse_toml(text, path)
    read = RecipeReader(path, text)
    read.known_keys(doc, (), _TOP_KEYS)
    name, tag = _image(read, read.table(doc, ("image",), required=True, example='with name = "myorg/my-image"'))
    base_table = read.table(doc, ("base",), required=True, example='with debian = "bookworm"')
    base = _base(read, base_table, Path(os.path.abspath(path)).parent)
    python = _python(read, read.table(doc, ("python",), required=True, example='with requirements = ["torch"]'))
    cuda = read.table(doc, ("cuda",))
    cuda = None if cuda is None else _cuda(read, cuda)
    platforms = _platforms(read, read.table(doc, ("platforms",)), base, cuda, "arch" in base_table)
    absolute = Path(os.path.abspath(path))
    env = _string_map(read, doc, "env", _ENV_NAME,
                      "is not an environment variable name", "letters, digits and _, not starting with a digit")
    return Recipe(
        path=absolute,
        name=name,
        tag=tag,
        base=base,
        python=python,
        cuda=cuda,
        platforms=platforms,
        patches=parse_patches(read, doc, absolute.parent),
        prune=_platform_prune(parse_prune(read, doc, DEBIAN_ARCHS), base, platforms),
        env=env,
        labels=_labels(read, doc),
        smoke=_smoke(read, read.table(doc, ("smoke",))),
        aot=parse_aot(read, doc, None if cuda is None else cuda.archs, env, bool(platforms)),
    )


RESERVED_LABELS = "io.imagebuild."  # the labels imagebuild writes itself (lock, recipe, patches, ...)


def _labels(read: RecipeReader, doc: dict) -> dict[str, str]:
    labels = _string_map(read, doc, "labels", _ANY_KEY, "is not a label key", "a label key cannot be empty")
    for name in labels:
        if name.startswith(RESERVED_LABELS):
            raise read.error(("labels", name), f"label {show(name)} is reserved for imagebuild's own labels",
                             hint="use another prefix, e.g. org.opencontainers.image.* or your own domain")
    return labels


def _smoke(read: RecipeReader, table: dict | None) -> SmokeSpec:
    if table is None:
        return SmokeSpec()
    key = ("smoke",)
    read.known_keys(table, key, ("imports", "accept_unknown"))
    imports = read.strings(table, key + ("imports",), example='["torch", "sglang"]')
    for index, module in enumerate(imports):
        if not _MODULE.fullmatch(module):
            raise read.error(key + ("imports", index), f"{show(module)} is not a module name",
                             hint='a dotted Python module name such as "sgl_kernel" or "flashinfer.jit"')
    accept = read.strings(table, key + ("accept_unknown",), example='["deep-gemm-sm120"]')
    for index, name in enumerate(accept):
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
            raise read.error(key + ("accept_unknown", index), f"{show(name)} is not a smoke check's name",
                             hint='a check name as the smoke report prints it, e.g. "deep-gemm-sm120"')
    return SmokeSpec(imports=tuple(dict.fromkeys(imports)), accept_unknown=tuple(dict.fromkeys(accept)))


def _image(read: RecipeReader, table: dict) -> tuple[str, str]:
    read.known_keys(table, ("image",), _IMAGE_KEYS)
    name = read.string(table, ("image", "name"), required=True, example='"myorg/my-image"')
    _check_repository(read, ("image", "name"), name)
    tag = read.string(table, ("image", "tag"))
    if tag is not None and not _TAG.fullmatch(tag):
        raise read.error(("image", "tag"), f"{show(tag)} is not a Docker tag",
                         hint="up to 128 of A-Z a-z 0-9 _ . -, not starting with . or -")
    return name, "latest" if tag is None else tag


def _check_repository(read: RecipeReader, key: Key, name: str) -> None:
    first, slash, rest = name.partition("/")
    registry, repository = (first, rest) if slash and ("." in first or ":" in first or first == "localhost") \
        else (None, name)
    if len(name) > 255:
        raise read.error(key, "a repository name is at most 255 characters")
    if registry is not None and not _REGISTRY.fullmatch(registry):
        raise read.error(key, f"{show(registry)} is not a registry host[:port]")
    if _REPOSITORY.fullmatch(repository):
        return
    hint = "lowercase letters and digits, in components joined by '.', '_', '__', '-' or '/'"
    if ":" in repository or "@" in repository:
        hint = "give the repository name alone: an image's tag goes in [image] tag"
    elif _REPOSITORY.fullmatch(repository.lower()):
        hint = f"repository names are lowercase: {show(name[:len(name) - len(repository)] + repository.lower())}"
    raise read.error(key, f"{show(name)} is not a Docker repository name", hint)


def image_ref_problem(ref: str) -> str | None:
    """Why NAME:TAG cannot name an image (the rules of [image] name and tag), or None when it can."""
    name, colon, tag = ref.rpartition(":")
    if not colon or "/" in tag:
        return "write NAME:TAG, e.g. myteam/sglang:test"
    if not _TAG.fullmatch(tag):
        return f"{show(tag)} is not a Docker tag"
    first, slash, rest = name.partition("/")
    registry, repository = (first, rest) if slash and ("." in first or ":" in first or first == "localhost") \
        else (None, name)
    if len(name) > 255 or (registry is not None and not _REGISTRY.fullmatch(registry)) \
            or not _REPOSITORY.fullmatch(repository):
        return f"{show(name)} is not a Docker repository name"
    return None


def _base(read: RecipeReader, table: dict, folder: Path) -> DebianBase | ImageBase:
    key = ("base",)
    read.known_keys(table, key, _DEBIAN_KEYS + _IMAGE_BASE_KEYS)
    if ("debian" in table) == ("image" in table):
        message = "set debian or image, not both" if "debian" in table else "missing debian or image"
        raise read.error(key, message, hint='debian = "bookworm" bootstraps a Debian suite; '
                                            'image = "repo@sha256:<digest>" starts from a pinned image')
    debian = "debian" in table
    allowed, other = (_DEBIAN_KEYS, "an image") if debian else (_IMAGE_BASE_KEYS, "a debian")
    for name in table:
        if name not in allowed:
            raise read.error(key + (name,), f"{name} only applies to {other} base",
                             hint=f"remove it, or switch to {other} base")
    return _debian_base(read, table, folder) if debian else _image_base(read, table)


def _debian_base(read: RecipeReader, table: dict, folder: Path) -> DebianBase:
    key = ("base",)
    suite = read.string(table, key + ("debian",))
    if not _SUITE.fullmatch(suite):
        raise read.error(key + ("debian",), f"{show(suite)} is not a Debian suite name",
                         hint='a codename in lowercase letters, e.g. "bookworm" or "trixie"')
    known = sorted(DEBIAN_SUITES)
    if suite not in known:  # its Python and glibc are facts imagebuild must have to check and resolve
        raise read.error(key + ("debian",), f"imagebuild has no facts for Debian {show(suite)}",
                         hint=f"one of: {', '.join(known)}; or an image base pinned by digest with its "
                              "python and glibc")
    packages = read.strings(table, key + ("packages",))
    for index, package in enumerate(packages):
        if not _DEBIAN_PACKAGE.fullmatch(package):
            raise read.error(key + ("packages", index), f"{show(package)} is not a Debian package name",
                             hint="lowercase letters, digits, + - and ., starting with a letter or digit; no version")
    arch = read.string(table, key + ("arch",))
    if arch is not None and arch not in DEBIAN_ARCHS:
        raise read.error(key + ("arch",), f"{show(arch)} is not a supported architecture",
                         hint=f"one of: {', '.join(DEBIAN_ARCHS)}")
    suites = read.strings(table, key + ("suites",))
    for index, name in enumerate(suites):
        if not (name == suite or name.startswith(suite + "-")) or not _DEBIAN_PACKAGE.fullmatch(name):
            raise read.error(key + ("suites", index), f"{show(name)} is not a suite of Debian {suite}",
                             hint=f'e.g. "{suite}", "{suite}-updates", "{suite}-security"')
    if table.get("suites") is not None and suite not in suites:
        raise read.error(key + ("suites",), f"names no {suite} suite itself: its Essential and "
                         "required packages decide the base", hint=f'add "{suite}"')
    components = read.strings(table, key + ("components",)) or ["main"]
    for index, name in enumerate(components):
        if not _DEBIAN_PACKAGE.fullmatch(name):
            raise read.error(key + ("components", index), f"{show(name)} is not a component name",
                             hint='e.g. "main", "contrib", "non-free-firmware"')
    urls = {}
    for name in ("mirror", "security_mirror", "snapshot"):
        value = read.string(table, key + (name,))
        if value is not None and not re.fullmatch(r"(https?|file)://\S+", value):
            raise read.error(key + (name,), f"{show(value)} is not an http(s):// or file:// URL",
                             hint="the archive's root, the folder that holds dists/ and pool/")
        urls[name] = value.rstrip("/") if value else None
    keyring = read.string(table, key + ("keyring",))
    if keyring is not None:
        keyring = os.path.abspath(folder / keyring)
        if not os.path.isfile(keyring):
            raise read.error(key + ("keyring",), f"{show(keyring)} does not exist",
                             hint=f"an OpenPGP keyring file (as gpgv --keyring takes), relative to the recipe's "
                                  f"folder, {folder}")
    return DebianBase(suite=suite, packages=tuple(sorted(set(packages))), arch=arch or "amd64",
                      suites=tuple(dict.fromkeys(suites)), components=tuple(dict.fromkeys(components)),
                      keyring=keyring, **urls)


def _image_base(read: RecipeReader, table: dict) -> ImageBase:
    key = ("base",)
    ref = read.string(table, key + ("image",))
    _check_pinned(read, key + ("image",), ref)
    python = read.string(table, key + ("python",), required=True, example='"3.11"')
    if not _MAJOR_MINOR.fullmatch(python):
        raise read.error(key + ("python",), f"{show(python)} is not a Python major.minor", hint='e.g. "3.11"')
    glibc = read.string(table, key + ("glibc",), required=True, example='"2.36"')
    if not _MAJOR_MINOR.fullmatch(glibc):
        raise read.error(key + ("glibc",), f"{show(glibc)} is not a glibc major.minor",
                         hint='e.g. "2.36"; `ldd --version` in the image prints it')
    python_path = read.string(table, key + ("python_path",))
    if python_path is not None and (not python_path.startswith("/") or "\0" in python_path):
        raise read.error(key + ("python_path",), f"{show(python_path)} is not an absolute path",
                         hint='e.g. "/usr/bin/python3"')
    return ImageBase(ref=ref, python=python, glibc=glibc, python_path=python_path or "/usr/bin/python3")


def _check_pinned(read: RecipeReader, key: Key, ref: str) -> None:
    """`ref` must be `repo[:tag]@sha256:<64 hex>`: a tag alone can move."""
    name, at, digest = ref.partition("@")
    last = name.rpartition("/")[2]
    repository, colon, tag = name.rpartition(":") if ":" in last else (name, "", "")
    _check_repository(read, key, repository)
    if colon and not _TAG.fullmatch(tag):
        raise read.error(key, f"{show(tag)} is not a Docker tag")
    if not at:
        raise read.error(key, f"{show(ref)} is not pinned by digest",
                         hint=f"write it as '{repository}@sha256:<64 hex digits>'; "
                              f"`skopeo inspect --format '{{{{.Digest}}}}' docker://{ref}` prints the digest")
    if not _SHA256.fullmatch(digest):
        raise read.error(key, f"{show(digest)} is not a sha256 digest",
                         hint="sha256: followed by 64 lowercase hex digits")


def _python(read: RecipeReader, table: dict) -> PythonSpec:
    key = ("python",)
    read.known_keys(table, key, _PYTHON_KEYS)
    requirements = read.strings(table, key + ("requirements",), required=True, example='["torch==2.14.1"]')
    required_at: dict[str, int] = {}  # canonical name -> index in requirements
    for index, text in enumerate(requirements):
        name = canonicalize_name(_requirement(read, key + ("requirements", index), text).name)
        if name in required_at:
            raise read.error(key + ("requirements", index),
                             f"{name!r} is already required by python.requirements[{required_at[name]}]",
                             hint="merge the two into one requirement")
        required_at[name] = index
    constraints = read.strings(table, key + ("constraints",))
    for index, text in enumerate(constraints):
        _requirement(read, key + ("constraints", index), text)
    excluded = set()
    for index, text in enumerate(read.strings(table, key + ("exclude",))):
        name = distribution_name(read, key + ("exclude", index), text)
        if name in required_at:
            raise read.error(key + ("exclude", index),
                             f"{name!r} is excluded but python.requirements[{required_at[name]}] requires it",
                             hint="keep it in one of the two lists")
        excluded.add(name)
    urls = read.strings(table, key + ("extra_index_urls",))
    for index, url in enumerate(urls):
        _check_url(read, key + ("extra_index_urls", index), url)
    return PythonSpec(
        requirements=tuple(requirements),
        constraints=tuple(constraints),
        exclude=tuple(sorted(excluded)),
        extra_index_urls=tuple(urls),
        exclude_newer=_exclude_newer(read, table.get("exclude_newer"), key + ("exclude_newer",)),
        layers=_layers(read, read.table(table, key + ("layers",)), key + ("layers",)),
    )


def _requirement(read: RecipeReader, key: Key, text: str) -> Requirement:
    try:
        return Requirement(text)
    except (ValueError, RecursionError) as err:  # InvalidRequirement is a ValueError
        raise read.error(key, f"{show(text)} is not a PEP 508 requirement: {err}",
                         hint='e.g. "torch==2.14.1" or "cuda-toolkit[nvcc]==13.0.3.0"') from None


def _check_url(read: RecipeReader, key: Key, url: str) -> None:
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc \
            or any(char.isspace() or not char.isprintable() for char in url):
        raise read.error(key, f"{show(url)} is not an http(s) URL",
                         hint='e.g. "https://mirror.example/whl/cu130"')


def _exclude_newer(read: RecipeReader, value, key: Key) -> str | None:
    """A stable string: dates as YYYY-MM-DD, timestamps in RFC 3339 with an upper-case T and Z."""
    hint = 'e.g. exclude_newer = "2026-11-20T00:00:00Z" or "2026-11-20"'
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise read.error(key, "a timestamp needs a UTC offset", hint=hint)
        text = value.isoformat()
        return text.removesuffix("+00:00") + "Z" if value.utcoffset() == timedelta(0) else text
    if isinstance(value, date):
        return value.isoformat()
    if not isinstance(value, str):
        raise read.error(key, f"expected an RFC 3339 timestamp or a date, got {toml_kind(value)}", hint=hint)
    if _DATE.fullmatch(value) and _valid_datetime(value, "%Y-%m-%d"):
        return value
    match = _TIMESTAMP.fullmatch(value)
    offset = match and match[3].upper()
    if match and _valid_datetime(f"{match[1]}T{match[2][:8]}", "%Y-%m-%dT%H:%M:%S") \
            and (offset == "Z" or _valid_datetime(offset[1:], "%H:%M")):
        return f"{match[1]}T{match[2]}{offset}"
    raise read.error(key, f"{show(value)} is not an RFC 3339 timestamp or a YYYY-MM-DD date", hint=hint)


def _valid_datetime(text: str, form: str) -> bool:
    try:
        datetime.strptime(text, form)
    except ValueError:
        return False
    return True


def _layers(read: RecipeReader, table: dict | None, key: Key) -> dict[str, tuple[str, ...]]:
    if table is None:
        return {}
    read.known_keys(table, key, LAYER_ORDER, what="layer")
    layers = {}
    for name in LAYER_ORDER:  # a fixed order, whatever order the recipe uses
        if name not in table:
            continue
        globs = read.strings(table, key + (name,))
        for index, glob in enumerate(globs):
            if not _NAME_GLOB.fullmatch(glob):
                raise read.error(key + (name, index), f"{show(glob)} is not a distribution name glob",
                                 hint='a name with * ? or [...] wildcards, e.g. "nvidia-*"')
        layers[name] = tuple(globs)
    return layers


def _platform_prune(prune: tuple[Prune, ...], base: DebianBase | ImageBase,
                    platforms: tuple[PlatformSpec, ...]) -> tuple[Prune, ...]:
    """A one-platform recipe keeps the [[prune]] entries for its platform; a multi-platform one keeps
    them all, and each platform's recipe (for_platform) its own."""
    if platforms:
        return prune
    arch = base.arch if isinstance(base, DebianBase) else "amd64"
    return tuple(entry for entry in prune if entry.applies_to(arch))


def _platforms(read: RecipeReader, table: dict | None, base: DebianBase | ImageBase, cuda: CudaSpec | None,
               base_arch_given: bool) -> tuple[PlatformSpec, ...]:
    """[platforms.amd64], [platforms.arm64]: each platform the image is built for, in a fixed order."""
    if table is None:
        return ()
    key = ("platforms",)
    read.known_keys(table, key, DEBIAN_ARCHS, what="platform")
    if not table:
        raise read.error(key, "names no platform", hint="add [platforms.amd64] and/or [platforms.arm64], "
                                                        "or remove [platforms] for a single-platform image")
    if not isinstance(base, DebianBase):
        raise read.error(key, "several platforms need a Debian base",
                         hint='a digest-pinned [base] image is one platform\'s image: use [base] debian = "bookworm"')
    if base_arch_given:
        raise read.error(("base", "arch"), "[base] arch and [platforms] both say which platforms to build",
                         hint="remove [base] arch: [platforms.<arch>] names each platform")
    specs = []
    for arch in DEBIAN_ARCHS:  # a fixed order, whatever order the recipe uses
        if arch not in table:
            continue
        entry = read.table(table, key + (arch,))
        where = key + (arch,)
        read.known_keys(entry, where, _PLATFORM_KEYS)
        archs = None
        if "cuda_archs" in entry:
            if cuda is None:
                raise read.error(where + ("cuda_archs",), "GPU targets without a [cuda] table",
                                 hint="add [cuda] with toolkit, archs and min_driver, or remove cuda_archs")
            archs = _arch_list(read, entry, where + ("cuda_archs",))
        specs.append(PlatformSpec(arch=arch, cuda_archs=archs, engine=_engine(read, entry, where + ("engine",))))
    return tuple(specs)


def _engine(read: RecipeReader, table: dict, key: Key) -> str | None:
    endpoint = read.string(table, key)
    if endpoint is None:
        return None
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in _ENGINE_SCHEMES or not rest or any(c.isspace() or not c.isprintable() for c in endpoint):
        raise read.error(key, f"{show(endpoint)} is not a Docker endpoint",
                         hint='as DOCKER_HOST takes it: "unix:///run/docker-arm64.sock", "tcp://grace-1:2376" '
                              'or "ssh://builder@grace-1"')
    return endpoint


def _arch_list(read: RecipeReader, table: dict, key: Key) -> tuple[Arch, ...]:
    archs: list[Arch] = []
    for index, text in enumerate(read.strings(table, key, required=True, example='["sm_120a"]')):
        try:
            arch = Arch.parse(text)
        except ValueError as err:
            raise read.error(key + (index,), str(err),
                             hint="sm_<major><minor>, or major.minor, with an optional a (this GPU only) "
                                  "or f (its family) suffix") from None
        if arch not in archs:
            archs.append(arch)
    return tuple(archs)


def _cuda(read: RecipeReader, table: dict) -> CudaSpec:
    key = ("cuda",)
    read.known_keys(table, key, _CUDA_KEYS)
    toolkit = read.string(table, key + ("toolkit",), required=True, example='"13.0"')
    if not re.fullmatch(r"\d{1,2}\.\d{1,2}", toolkit):
        try:
            hint = f'write the major.minor alone: "{CudaVersion.parse(toolkit)}"'
        except ValueError:
            hint = 'e.g. toolkit = "13.0"'
        raise read.error(key + ("toolkit",), f"{show(toolkit)} is not a CUDA major.minor", hint=hint)
    archs = _arch_list(read, table, key + ("archs",))
    min_driver = read.string(table, key + ("min_driver",), required=True, example='"580.65.06"')
    try:
        parse_driver(min_driver)
    except ValueError as err:
        raise read.error(key + ("min_driver",), str(err),
                         hint="the oldest driver on the target hosts, as nvidia-smi prints it") from None
    return CudaSpec(toolkit=CudaVersion.parse(toolkit), archs=tuple(archs), min_driver=min_driver.strip())


def _string_map(read: RecipeReader, doc: dict, name: str, pattern: re.Pattern, bad_key: str,
                key_hint: str) -> dict[str, str]:
    table = read.table(doc, (name,))
    if table is None:
        return {}
    for item in table:
        key = (name, item)
        if not pattern.fullmatch(item):
            raise read.error(key, f"{show(item)} {bad_key}", hint=key_hint)
        if "\0" in read.string(table, key):
            raise read.error(key, "contains a NUL character")
    return dict(table)
