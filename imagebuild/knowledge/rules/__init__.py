"""The rules: a recipe, its lock, its wheels and a live host against the facts -> Findings; errors stop a build.

    recipe.py   before resolving (check_recipe) and on the locked versions (check_resolved)
    lock.py     a lock fresh or stale, its patches, the base's updates waiting, what the locked wheels
                say of themselves (check_artifacts)
    host.py     a live host's facts as the doctor probe reports them (compat_findings)

The flows gather the facts and call these; every rule lives here. This face re-exports what the flows
call as `rules.X`; host.py, which reads the payload probe's vocabulary, is imported by name (doctor alone
needs it). May import: the facts (facts.py, finding.py), recipe/ (what they judge), payload/ (host.py).
"""

from imagebuild.knowledge.rules.lock import (ARTIFACT_SOURCE, base_updates_unknown, check_artifacts, check_base_updates,
                                             check_freshness, check_overlaps, check_patches, check_unread)
from imagebuild.knowledge.rules.recipe import (check_aot_quantization, check_archs, check_driver, check_glibc,
                                               check_recipe, check_resolved, check_toolchain, check_torch, gpu_targets)

__all__ = ["ARTIFACT_SOURCE", "base_updates_unknown", "check_aot_quantization", "check_archs", "check_artifacts",
           "check_base_updates", "check_driver", "check_freshness", "check_glibc", "check_overlaps", "check_patches",
           "check_recipe", "check_resolved", "check_toolchain", "check_torch", "check_unread", "gpu_targets"]
