"""Errors as RFC 9457 problem details, with the field path of every violation."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

MEDIA_TYPE = "application/problem+json"


class Problem(Exception):
    """Raise to answer with a problem document."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        kind: str = "about:blank",
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ):
        super().__init__(detail)
        self.status, self.title, self.detail, self.kind = status, title, detail, kind
        self.errors, self.headers, self.extra = errors, headers, extra


def problem_response(problem: Problem, instance: str | None = None) -> JSONResponse:
    body: dict[str, Any] = {
        "type": problem.kind,
        "title": problem.title,
        "status": problem.status,
        "detail": problem.detail,
        **problem.extra,
    }
    if instance:
        body["instance"] = instance
    if problem.errors is not None:
        body["errors"] = problem.errors
    return JSONResponse(body, status_code=problem.status, media_type=MEDIA_TYPE, headers=problem.headers)


async def handle_problem(request: Request, problem: Exception) -> JSONResponse:
    assert isinstance(problem, Problem)
    return problem_response(problem, request.url.path)


def not_found(what: str) -> Problem:
    return Problem(
        404, "Not Found", f"{what} does not exist or is not visible to you", kind="/problems/not-found"
    )


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {
        "description": description,
        "content": {
            MEDIA_TYPE: {
                "schema": {
                    "type": "object",
                    "properties": {
                        "type": {"type": "string"},
                        "title": {"type": "string"},
                        "status": {"type": "integer"},
                        "detail": {"type": "string"},
                        "errors": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {"path": {"type": "string"}, "rule": {"type": "string"}},
                            },
                        },
                    },
                    "required": ["type", "title", "status", "detail"],
                }
            }
        },
    }
    for status, description in {
        401: "Missing or invalid bearer token",
        403: "Not allowed for this role or team",
        404: "Not found, or not visible to the caller",
        409: "Conflict with the current state",
        413: "Request body over the limit",
        422: "Invalid input; `errors` lists each field path and rule",
        503: "A dependency (the database) is unavailable",
    }.items()
}
