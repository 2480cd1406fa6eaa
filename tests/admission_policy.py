"""A STAND-IN for the API server's ValidatingAdmissionPolicy plugin, for tests.

It evaluates a rendered ``ValidatingAdmissionPolicy`` (as ``k8s manifests`` prints it)
against AdmissionReview-shaped requests with cel-python, a CEL implementation that
buildmatrix did not write, the way the API server's plugin does
(kubernetes ``staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating``):

- ``matchConstraints.resourceRules``: the resource and the operation must match;
- ``matchConditions``: all must be true, else the policy does not apply (allowed);
- ``variables``: computed in order, reachable as ``variables.NAME``;
- ``validations``: each must be true; false denies with its message; an expression
  that fails to evaluate denies too, since the policy's ``failurePolicy`` is ``Fail``.

Looser than the real plugin: no type check against the Node schema at creation, no
cost limits, one binding with ``validationActions: [Deny]`` assumed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import celpy
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

Json = Any


@dataclass(frozen=True)
class UserInfo:
    username: str
    extra: dict[str, list[str]]


def request(
    user: UserInfo, old: Json, new: Json, *, resource: str = "nodes", operation: str = "UPDATE"
) -> Json:
    """An AdmissionReview ``request`` with what CEL sees of it."""
    return {
        "request": {
            "operation": operation,
            "resource": {"group": "", "version": "v1", "resource": resource},
            "userInfo": {"username": user.username, "extra": user.extra},
        },
        "object": new,
        "oldObject": old,
    }


@functools.cache
def _environment() -> celpy.Environment:
    """cel-python's environment, made on first use: it builds its parser (~0.2 s), which
    every pytest worker would otherwise pay for when it imports this module."""
    return celpy.Environment()


@functools.cache
def _program(expression: str) -> Any:
    env = _environment()
    return env.program(env.compile(expression))


def _eval(expression: str, activation: Json) -> Any:
    program = _program(expression)
    try:
        value = program.evaluate(activation)
    except CELEvalError as exc:
        return exc
    return value


def denials(policy: Json, review: Json) -> list[str]:
    """The messages with which ``policy`` denies ``review`` (empty: allowed)."""
    spec = policy["spec"]
    req = review["request"]
    rules = spec["matchConstraints"]["resourceRules"]
    resource = req["resource"]["resource"]
    if not any(resource in r["resources"] and req["operation"] in r["operations"] for r in rules):
        return []
    activation: dict[str, Any] = {k: json_to_cel(v) for k, v in review.items()}
    for cond in spec.get("matchConditions", []):
        value = _eval(cond["expression"], activation)
        if isinstance(value, CELEvalError):
            return [f"match condition {cond['name']}: {value}"]
        if not value:
            return []
    variables: dict[str, Any] = {}
    for var in spec.get("variables", []):
        variables[var["name"]] = _eval(var["expression"], activation)
        activation["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
    denied = []
    for rule in spec["validations"]:
        value = _eval(rule["expression"], activation)
        if not isinstance(value, celpy.celtypes.BoolType) or not value:
            denied.append(rule["message"])
    return denied
