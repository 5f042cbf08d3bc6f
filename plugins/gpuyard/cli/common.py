"""What every `gpuyard` command shares: its options, its settings, its consoles, and the API call.

A command that calls the HTTP API is declared with `api_command`, as Ray declares `ray job` commands
with `add_common_job_options`: its first parameter, `api`, stands for the options --home, --url,
--token, --retry-for (and --json), which come after its own, written here once. `api.call` makes one
request and exits naming the error; `api.show` prints the answer as JSON with --json, else as a table
or line. While the API is away the client retries (a line on stderr says so), and after --retry-for
seconds the command exits 1 with one line naming the API and how long it was unreachable.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import httpx
import typer
from gpuyard_client import OUTAGE_ENV, ApiError, ApiUnreachable, NotConfigured, outage_s, resolve_endpoint
from rich.console import Console, RenderableType

from gpuyard.cli.admin_client import AdminClient
from gpuyard.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

T = TypeVar("T")

log = logging.getLogger("gpuyard.cli")
out = Console(width=None if sys.stdout.isatty() else 160)  # pipes and logs get whole tables
err = Console(stderr=True, soft_wrap=True)

Home = Annotated[
    Path | None,
    typer.Option("--home", help="State of the embedded instance [default: $GPUYARD_HOME or ~/.gpuyard]"),
]
Url = Annotated[str | None, typer.Option("--url", help="API URL [default: $GPUYARD_URL, else from --home]")]
Token = Annotated[
    str | None, typer.Option("--token", help="Bearer token [default: $GPUYARD_TOKEN, else --home's]")
]
RetryFor = Annotated[
    float | None,
    typer.Option(
        "--retry-for",
        min=0,
        help=f"Seconds to ride out an API outage before giving up [default: ${OUTAGE_ENV}, else 300]",
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def settings_for(home: Path | None, **overrides: Any) -> Settings:
    if home is not None:
        os.environ["GPUYARD_HOME"] = str(home)  # also where config.yaml is looked for
    try:
        settings = load_settings(**overrides)
    except SettingsError as error:
        fail(str(error))
    settings.home.mkdir(parents=True, exist_ok=True)
    if settings.home.stat().st_uid == os.geteuid():
        settings.home.chmod(0o700)  # the store, the admin token, the secrets: the control plane's only
    return settings


def server_settings(home: Path | None, **overrides: Any) -> Settings:
    """The settings of a server process (up, api, scheduler, relay, migrate), its logging set up and
    the names it gives parts (launcher, scheduler_policy) found in their registries."""
    from gpuyard.services import check_names, configure_logging

    settings = settings_for(home, **overrides)
    configure_logging(settings)
    try:
        check_names(settings)
    except SettingsError as error:
        fail(str(error))
    return settings


def store(settings: Settings) -> Engine:
    """The store, or a clear exit when its schema is not at head (production: run `gpuyard migrate`)."""
    from gpuyard.store.db import SchemaNotAtHead, open_store

    try:
        return open_store(settings)
    except SchemaNotAtHead as error:
        fail(str(error))


def hidden(url: str | None) -> str:
    """A database URL fit for a log line: its password masked."""
    from sqlalchemy.engine import make_url

    return make_url(str(url)).render_as_string(hide_password=True)


def call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`function(*args, **kwargs)`, or an exit naming what the server said (2: the request was invalid)."""
    try:
        return function(*args, **kwargs)
    except ApiError as error:
        fail(str(error), code=2 if error.status in (400, 409, 413, 422) else 1)
    except ApiUnreachable as error:  # it already names the API and how long it was away
        fail(str(error))
    except (OSError, httpx.TransportError) as error:
        fail(f"cannot reach the server: {type(error).__name__}: {error}")


class Api:
    """The HTTP API as a command reaches it: where and as whom (--home, --url, --token), how long an
    outage is ridden out (--retry-for), and how to print (--json). It connects when first used, so a
    command checks its own input first."""

    def __init__(
        self,
        home: Path | None,
        url: str | None,
        token: str | None,
        retry_for_s: float | None = None,
        as_json: bool = False,
    ):
        self.home, self.url, self.token, self.as_json = home, url, token, as_json
        self.retry_for_s = retry_for_s

    @contextmanager
    def client(self) -> Iterator[AdminClient]:
        try:
            endpoint = resolve_endpoint(self.url, self.token, self.home)
            client = AdminClient(endpoint, retry_for_s=outage_s(self.retry_for_s), notify=self.tell)
        except NotConfigured as error:
            fail(str(error))
        with client:
            yield client

    def call(self, request: Callable[[AdminClient], T]) -> T:
        """One request on a connection of its own."""
        with self.client() as client:
            return call(request, client)

    @staticmethod
    def tell(message: str) -> None:
        """The client's word that it waits for the API: on stderr, so output stays clean."""
        err.print(f"[yellow]{message}[/yellow]", highlight=False)

    def show(self, data: Any, render: Callable[[Any], RenderableType]) -> None:
        """`data` as JSON with --json, else as `render` draws it."""
        if self.as_json:
            print_json(data)
        else:
            out.print(render(data))


_SHARED = (("home", Home, None), ("url", Url, None), ("token", Token, None), ("retry_for_s", RetryFor, None))
_JSON = ("as_json", AsJson, False)


def api_command(
    group: typer.Typer, name: str | None = None, *, json: bool = True
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register `function(api, ...)` as the command `name` of `group`: `api` becomes the options
    --home, --url, --token, --retry-for (and --json unless `json` is false), after the function's own."""

    def register(function: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(function, eval_str=True)
        _, *own = signature.parameters.values()  # the first is `api`
        shared = [
            inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
            for option, annotation, default in (*_SHARED, *([_JSON] if json else []))
        ]

        def command(**options: Any) -> None:
            given = {option: options.pop(option) for option, _, _ in _SHARED}
            api = Api(**given, as_json=options.pop("as_json", False))
            function(api, **options)

        parameters = [*own, *shared]
        command.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.__name__, command.__qualname__ = function.__name__, function.__qualname__
        command.__doc__, command.__module__ = function.__doc__, function.__module__
        group.command(name)(command)
        return function

    return register
