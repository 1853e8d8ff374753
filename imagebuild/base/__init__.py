"""Stage 2a, base: what a lock pins of its base, as plain data: no network, no engine.

    identity.py  BaseIdentity (a Debian suite's locked .debs and sources, or an image by digest)
    debian.py    Debian's own formats: Release, Packages, dpkg status, version order

How a Debian base is resolved from a mirror and bootstrapped from its lock is `bootstrap/`.
May import: common, errors.
"""

from imagebuild.base.identity import BaseIdentity, LockedDeb, LockedSuite

__all__ = ["BaseIdentity", "LockedDeb", "LockedSuite"]
