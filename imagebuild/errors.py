"""Error types a user can act on; the CLI maps each to an exit code."""

from __future__ import annotations

# Exit codes a CI can branch on.
EXIT_OK = 0
EXIT_FAILED = 1  # findings with errors, a failed build or a failed smoke test
EXIT_BAD_INPUT = 2  # a recipe, lock or argument that cannot be used as given
EXIT_UNAVAILABLE = 3  # the engine or a host tool is missing or not running


class ImagebuildError(Exception):
    """Base class: `str(err)` is the whole message shown to the user."""

    exit_code = EXIT_BAD_INPUT

    def details(self) -> dict:
        """What --json adds to the error object besides the type and the message."""
        return {}


class RecipeError(ImagebuildError):
    """A recipe that cannot be used: names the file, the key or line, and the fix."""

    def __init__(self, path, message: str, *, key: str | None = None,
                 line: int | None = None, column: int | None = None, hint: str | None = None):
        self.path = str(path)
        self.key = key
        self.line = line
        self.column = column
        self.hint = hint
        self.reason = message
        where = self.path
        if line is not None:
            where += f":{line}" + (f":{column}" if column is not None else "")
        text = f"{where}: {f'[{key}] ' if key else ''}{message}"
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)

    def details(self) -> dict:
        return {"path": self.path, "key": self.key, "line": self.line, "column": self.column,
                "reason": self.reason, "hint": self.hint}


class LockError(ImagebuildError):
    """A lock that is missing, unreadable, stale, or cannot be resolved."""


class StaleLock(LockError):
    """The lock no longer matches its recipe or template: relock."""


class ResolveFailed(LockError):
    """The resolver found no solution; `package` names the distribution it found no release or wheel
    of, when that is why (adopt leaves such a distribution out and says so)."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, package: str | None = None):
        self.package = package
        super().__init__(message)


class FindingsFailed(ImagebuildError):
    """Compatibility rules found errors; the findings travel with the exception."""

    exit_code = EXIT_FAILED

    def __init__(self, findings):
        self.findings = list(findings)
        errors = [f for f in self.findings if f.stops_build]
        lines = [f"{len(errors)} compatibility error(s):"]
        lines += [f"  - {f.message}\n    fix: {f.fix}" for f in errors]
        super().__init__("\n".join(lines))


class EngineUnavailable(ImagebuildError):
    exit_code = EXIT_UNAVAILABLE


class ImageNotFound(ImagebuildError):
    """The engine has no image of that reference (engine.Engine.require and image_config raise it); the one
    message for it, wherever an image is looked up."""

    def __init__(self, image: str, engine: str, hint: str = ""):
        self.image, self.engine = image, engine
        super().__init__(f"no image {image!r} in the {engine} engine: build, pull or load it first{hint}")

    def details(self) -> dict:
        return {"image": self.image, "engine": self.engine}


class ToolMissing(ImagebuildError):
    """A host tool (mmdebstrap, uv, docker CLI) is not installed."""

    exit_code = EXIT_UNAVAILABLE


class BuildFailed(ImagebuildError):
    """A build that stopped; `step` is the failed step (engine/build_log.py) when one did."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, step=None):
        self.step = step
        super().__init__(message)

    def details(self) -> dict:
        return {"step": self.step.to_dict()} if self.step is not None else {}


class SmokeFailed(ImagebuildError):
    exit_code = EXIT_FAILED

    def __init__(self, message: str, report: dict | None = None):
        self.report = report
        super().__init__(message)


class BaseFetchFailed(LockError):
    """A locked .deb (or a suite's index) that no source serves as locked: gone, or different bytes."""

    exit_code = EXIT_FAILED
