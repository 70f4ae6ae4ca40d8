"""Whether a JSON schema's references leave it any finite value at all.

`{"$defs": {"a": {"properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}}, "$ref": "#/$defs/a"}`
asks for an object that holds another such object, forever: no JSON text satisfies it. xgrammar
then writes `{"x": {"x": ...` until max_tokens and llguidance breaks off after `{`; both are 200s
whose output cannot satisfy the schema. Refusing such a schema up front needs no grammar engine:
a reference is *productive* once its schema has a finite value given the productive references
so far (a least fixpoint, computed with a worklist), and the schema is satisfiable if its root is.

The check is conservative: anything it does not model (patternProperties, if/then, a reference it
cannot resolve) counts as satisfiable, so it refuses only what certainly has no finite value.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from tram.sampling_params.schema_walk import iterate_schemas, resolve_pointer


def endless_ref(schema: Any) -> str | None:
    """A local `$ref` that the schema's root needs and that no finite value satisfies, or None."""
    targets = _ref_targets(schema)
    if not targets:
        return None
    productive = _productive(schema, targets)
    missing: list[str] = []
    if _finite(schema, productive, missing, targets):
        return None
    return missing[0] if missing else "#"


def _local_ref(node: dict[str, Any]) -> str | None:
    ref = node.get("$ref")
    return ref if isinstance(ref, str) and ref.startswith("#") else None


def _ref_targets(schema: Any) -> dict[str, set[str]]:
    """Each resolvable local reference -> the references inside the schema it names."""
    targets: dict[str, set[str]] = {}
    pending = [ref for _, node in iterate_schemas(schema) if (ref := _local_ref(node)) is not None]
    while pending:
        ref = pending.pop()
        if ref in targets:
            continue
        try:
            target = resolve_pointer(schema, ref)
        except KeyError:
            continue  # the grammar engine reports it
        inner = {r for _, node in iterate_schemas(target) if (r := _local_ref(node)) is not None}
        targets[ref] = inner
        pending.extend(inner)
    return targets


def _productive(schema: Any, targets: dict[str, set[str]]) -> set[str]:
    """The references with a finite value: a worklist over the reverse dependencies."""
    users: dict[str, set[str]] = {ref: set() for ref in targets}
    for ref, inner in targets.items():
        for used in inner & targets.keys():
            users[used].add(ref)
    productive: set[str] = set()
    queue = deque(targets)
    while queue:
        ref = queue.popleft()
        if ref not in productive and _finite(resolve_pointer(schema, ref), productive, [], targets):
            productive.add(ref)
            queue.extend(users[ref] - productive)
    return productive


def _finite(node: Any, productive: set[str], missing: list[str], known: dict[str, set[str]]) -> bool:
    """Whether `node` has a finite value when only the `productive` references do. Recursive
    within one schema (the request's depth is bounded); never through a reference."""
    if node is False:
        return False
    if not isinstance(node, dict):
        return True
    ref = _local_ref(node)
    if ref is not None and ref not in productive and ref in known:  # an unresolvable one: the engine's error
        missing.append(ref)
        return False
    all_of, any_of = node.get("allOf"), node.get("anyOf", node.get("oneOf"))
    if isinstance(all_of, list) and not all(_finite(s, productive, missing, known) for s in all_of):
        return False
    if isinstance(any_of, list) and not any(_finite(s, productive, missing, known) for s in any_of):
        return False
    types = node.get("type")
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else None
    if types is None or any(t not in ("object", "array") for t in types):
        return True  # a scalar (or, with no type, any value) satisfies the object and array keywords
    return ("object" in types and _object_finite(node, productive, missing, known)) or (
        "array" in types and _array_finite(node, productive, missing, known)
    )


def _object_finite(node: dict[str, Any], productive: set[str], missing: list[str], known: Any) -> bool:
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    required = node.get("required") if isinstance(node.get("required"), list) else []
    return all(_finite(properties.get(name, True), productive, missing, known) for name in required)


def _array_finite(node: dict[str, Any], productive: set[str], missing: list[str], known: Any) -> bool:
    prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
    items = node.get("items", True)
    count = node.get("minItems", 0)
    count = min(count, len(prefix) + 1) if isinstance(count, int) else 0
    needed = [prefix[i] if i < len(prefix) else items for i in range(count)]
    return all(_finite(s, productive, missing, known) for s in needed)


def endless_message(ref: str) -> str:
    return (
        f"no finite JSON value satisfies the schema: every value of {ref!r} must hold another one "
        "('$ref' loops with no way out: make a property optional, or allow an empty array)"
    )
