"""Hypothesis helpers for readers of JSON documents (locks, layouts): arbitrary JSON values, and a real
document with one field anywhere in it replaced by one of them."""

from __future__ import annotations

from hypothesis import strategies as st

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children,
                                                                         max_size=5),
    max_leaves=30)


def replace_one_field(doc, data) -> None:
    """Replace, in place, one value anywhere in `doc` (drawn with hypothesis's `data`) by arbitrary JSON."""
    paths = []

    def walk(node, path):
        paths.append(path)
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            walk(child, path + (key,))
    walk(doc, ())
    path = data.draw(st.sampled_from([p for p in paths if p]))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = data.draw(json_values)
