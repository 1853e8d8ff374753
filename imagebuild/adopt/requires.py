"""Which installed distributions require which: Requires-Dist evaluated with the environment's own
markers (extras included), and the few top-level ones whose requirements install all the rest. Pure.

    needs_of(dist, markers, installed) -> Needs: what it requires of the installed ones, always and per extra
    reach(roots, graph)                -> what installing the roots (with their extras) installs
    top_level(graph)                   -> {name: extras}: roots whose closure is the whole graph
    dependents(graph, roots)           -> for each distribution, the ones that require it
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from imagebuild.adopt.inventory import Installed

Edge = tuple[str, frozenset]  # (the distribution required, the extras asked of it)


@dataclass(frozen=True)
class Needs:
    always: tuple[Edge, ...]  # requirements without an extra (markers true here)
    by_extra: Mapping[str, tuple[Edge, ...]]  # extra -> what it adds of the installed ones
    unmet: frozenset = frozenset()  # extras that require something not installed: not installed with them


def _evaluates(requirement: Requirement, markers: Mapping[str, str], extra: str) -> bool:
    if requirement.marker is None:
        return not extra
    try:
        return requirement.marker.evaluate({**markers, "extra": extra})
    except UndefinedEnvironmentName:
        return False


def needs_of(dist: Installed, markers: Mapping[str, str], installed: Iterable[str]) -> tuple[Needs, list[str]]:
    """What a distribution requires of the installed ones (and its Requires-Dist lines unreadable here)."""
    present = set(installed)
    always, by_extra, unmet, unreadable = [], {}, set(), []
    extras = sorted({canonicalize_name(e) for e in dist.extras})
    for line in dist.requires:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            unreadable.append(line)
            continue
        name = canonicalize_name(requirement.name)  # its own name too: `foo[all]` asks its extras
        edge = (name, frozenset(canonicalize_name(e) for e in requirement.extras))
        if _evaluates(requirement, markers, ""):
            always += [edge] if name in present else []
            continue
        for extra in extras:
            if _evaluates(requirement, markers, extra):
                if name in present:
                    by_extra.setdefault(extra, []).append(edge)
                else:
                    unmet.add(extra)
    return Needs(tuple(always), {k: tuple(v) for k, v in by_extra.items()}, frozenset(unmet)), unreadable


def reach(roots: Mapping[str, frozenset], graph: Mapping[str, Needs]) -> dict[str, frozenset]:
    """Every distribution the roots' requirements install, with the extras asked of it."""
    seen: dict[str, frozenset] = {}
    queue = [(name, frozenset(extras)) for name, extras in roots.items() if name in graph]
    while queue:
        name, extras = queue.pop()
        before = seen.get(name)
        if before is not None and extras <= before:
            continue
        now = (before or frozenset()) | extras
        seen[name] = now
        needs = graph[name]
        for target, asked in needs.always + tuple(e for extra in sorted(now) for e in needs.by_extra.get(extra, ())):
            if target in graph:
                queue.append((target, asked))
    return seen


def required(graph: Mapping[str, Needs]) -> set[str]:
    """The distributions another one in the graph requires (with the extras its dependents ask)."""
    found: set[str] = set()
    for name, needs in graph.items():
        reached = reach({name: frozenset()}, graph)
        found |= {other for other in reached if other != name}
    return found


def satisfied_extras(needs: Needs, keep: set[str]) -> frozenset:
    """The extras whose every requirement is installed (and kept): those it was most likely installed with."""
    return frozenset(extra for extra, edges in needs.by_extra.items()
                     if edges and extra not in needs.unmet and all(t in keep for t, _ in edges))


def top_level(graph: Mapping[str, Needs]) -> dict[str, frozenset]:
    """Roots, each with its satisfied extras, whose closure is the whole graph: what nothing requires,
    plus (the first by name) a member of each cycle nothing outside it requires; then, by name, each
    root the others' extras install anyway is dropped."""
    keep = set(graph)
    extras = {name: satisfied_extras(graph[name], keep) for name in graph}
    roots = {name: extras[name] for name in sorted(keep - required(graph))}

    def complete(candidate: Mapping[str, frozenset]) -> bool:
        return set(reach(candidate, graph)) == keep

    for name in sorted(keep):  # a cycle: no member is a root, so take the first by name
        if name not in reach(roots, graph):
            roots[name] = extras[name]
    for name in sorted(roots):
        rest = {other: value for other, value in roots.items() if other != name}
        if rest and complete(rest):
            roots = rest
    assert complete(roots), "top_level must reach every distribution"
    return roots


def dependents(graph: Mapping[str, Needs], roots: Mapping[str, frozenset]) -> dict[str, list[str]]:
    """For each distribution, the ones that require it (with the extras the roots ask)."""
    asked = reach(roots, graph)
    found: dict[str, list[str]] = {}
    for name, extras in sorted(asked.items()):
        needs = graph[name]
        for target, _ in needs.always + tuple(e for extra in sorted(extras) for e in needs.by_extra.get(extra, ())):
            if target != name and name not in found.setdefault(target, []):
                found[target].append(name)
    return found
