"""Options and output helpers shared by the commands."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from buildmatrix import PROFILES_ENV
from buildmatrix.errors import InputError
from buildmatrix.labelkeys import TAINT_KEY, GfdKeys

if TYPE_CHECKING:
    from buildmatrix.image.containerd_store import Store
    from buildmatrix.profiles import ProfileSet

F = TypeVar("F", bound=Callable[..., Any])

JSON_VERSION = 1


class _NotBlank(click.ParamType[Any, Any]):
    """``inner``, refusing an empty or blank value: ``--driver "$NODE_DRIVER"`` with the
    variable unset must not read as "no driver given" and drop every driver floor.

    Click's own environment variables need no such care: an empty one counts as
    unset (``Parameter.resolve_envvar_value``), so its default applies, as documented
    for ``$BUILDMATRIX_PROFILES``, ``$CONTAINERD_ROOT`` and the others."""

    def __init__(self, inner: click.ParamType[Any, Any]) -> None:
        self.inner = inner
        self.name = inner.name

    def split_envvar_value(self, rv: str) -> Sequence[str]:
        return self.inner.split_envvar_value(rv)

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        return self.inner.get_metavar(param, ctx)

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[click.shell_completion.CompletionItem]:
        return self.inner.shell_complete(ctx, param, incomplete)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            from click.core import ParameterSource

            source = ctx.get_parameter_source(param.name) if ctx and param and param.name else None
            if source is ParameterSource.ENVIRONMENT and isinstance(param, click.Option):
                names = param.envvar if isinstance(param.envvar, str) else None
                self.fail(
                    f"the environment variable {names or 'that sets it'} is blank: set it "
                    "to a value, or unset it for the default.",
                    param,
                    ctx,
                )
            leave_out = (
                f", or leave out {param.opts[0]} for its default"
                if isinstance(param, click.Option)
                else ""
            )
            self.fail(
                f"the value is {'blank' if value else 'empty'}. Give one{leave_out} (an "
                'unset or empty shell variable, as in "$VAR", gives an empty value).',
                param,
                ctx,
            )
        return self.inner.convert(value, param, ctx)


def _refuse_blank(params: list[click.Parameter]) -> None:
    for param in params:
        if isinstance(param, click.Option) and (param.is_flag or param.count):
            continue
        if isinstance(param.type, click.types.StringParamType | click.Path):
            param.type = _NotBlank(param.type)


class Command(click.Command):
    """Every command's class: each text or path it takes (option or argument) refuses an
    empty or blank value with exit 2 naming it (:class:`_NotBlank`), in one place
    rather than per option; choices and numbers refuse one already."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _refuse_blank(self.params)


class Group(click.Group):
    """:class:`Command` for a group: its own options and its subcommands'."""

    command_class = Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _refuse_blank(self.params)


def profiles_option(func: F) -> F:
    decorator = click.option(
        "--profiles",
        "profiles_dir",
        metavar="DIR",
        envvar=PROFILES_ENV,
        default=None,
        help=f"Folder of arch profiles (sm_XY.yaml). Default: ${PROFILES_ENV}, else the "
        "shipped ones.",
    )
    return decorator(func)


_JSON_FLAG = "buildmatrix.json"


def json_option(func: F) -> F:
    """``--format text|json`` (default text), the one output option of every command
    that prints JSON, passed on as the boolean ``as_json``; ``--json`` stays as the
    same as ``--format json``."""

    def remember(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value:
            ctx.meta[_JSON_FLAG] = True

    def wanted(ctx: click.Context, _param: click.Parameter, value: str) -> bool:
        return value == "json" or bool(ctx.meta.get(_JSON_FLAG))

    func = click.option(
        "--format",
        "as_json",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        callback=wanted,
        help='text (tables) or json (with "version": 1).',
    )(func)
    # eager: read before --format whatever the order on the command line
    return click.option(
        "--json",
        is_flag=True,
        is_eager=True,
        expose_value=False,
        callback=remember,
        help="The same as --format json.",
    )(func)


# A day: far beyond any registry's answer, and far below where a socket's time-out
# overflows (socket.settimeout(1e10): "OverflowError: timestamp out of range for
# platform time_t"; NaN: "ValueError: Invalid value NaN").
MAX_TIMEOUT = 86400


class Seconds(click.FloatRange):
    """A time-out: a finite number of seconds above 0, at most :data:`MAX_TIMEOUT`.
    ``float`` reads ``nan`` and ``inf`` too; click's range lets NaN through (it compares
    false both ways), and either would reach the socket as a traceback."""

    def __init__(self) -> None:
        super().__init__(min=0, min_open=True, max=MAX_TIMEOUT)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)  # infinity is out of the range
        if math.isnan(seconds):
            self.fail(
                f"{value!r} is not a number of seconds: give one in the range "
                f"0<x<={MAX_TIMEOUT} (a day), e.g. 30.",
                param,
                ctx,
            )
        return seconds


def timeout_option(func: F) -> F:
    """--timeout SECONDS: a registry's connect and read time-out for this command
    (image/registry.py, DEFAULT_TIMEOUT; docs/check.md, "Time-outs")."""

    def enter(ctx: click.Context, _param: click.Parameter, value: float | None) -> None:
        if value is not None:
            from buildmatrix.image.registry import waiting

            ctx.with_resource(waiting(value))

    decorator = click.option(
        "--timeout",
        type=Seconds(),
        metavar="SECONDS",
        expose_value=False,
        callback=enter,
        help="How long to wait for a registry to accept a connection, and then for each "
        "next bytes of its answer (default 30).",
    )
    return decorator(func)


def pools_option(func: F) -> F:
    decorator = click.option(
        "--pools",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        help="Pools file: family/product -> pool (label gpu-pool).",
    )
    return decorator(func)


def platform_option(func: F) -> F:
    decorator = click.option(
        "--platform",
        default="linux/amd64",
        show_default=True,
        metavar="OS/ARCH",
        help="Platform to pick from a multi-platform image.",
    )
    return decorator(func)


# option -> (environment variable, what it is), as ctr takes them; the defaults are
# image/containerd_store.py's (not imported here: --help and --version start without
# the image package), held equal by tests/test_containerd.py
CONTAINERD_OPTIONS = {
    "--containerd-address": (
        "CONTAINERD_ADDRESS",
        "containerd's socket (default /run/containerd/containerd.sock)",
    ),
    "--containerd-namespace": (
        "CONTAINERD_NAMESPACE",
        "containerd namespace (default k8s.io, the CRI's)",
    ),
    "--containerd-root": (
        "CONTAINERD_ROOT",
        "containerd's root folder (default /var/lib/containerd)",
    ),
}


def _keep_containerd(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta[f"buildmatrix.{param.name}"] = value


def containerd_options(func: F) -> F:
    """Where ``containerd:`` REFs are read (image/containerd.py); read by
    :func:`containerd_store` rather than passed, so commands keep their parameters."""
    for flag, (env, what) in CONTAINERD_OPTIONS.items():
        func = click.option(
            flag,
            envvar=env,
            metavar="PATH" if "namespace" not in flag else "NAME",
            expose_value=False,
            callback=_keep_containerd,
            help=f"For containerd: REFs: {what}; or ${env}.",
        )(func)
    return func


def containerd_store() -> Store:
    """The containerd store the current command's options name (image/containerd.py)."""
    from buildmatrix.image.containerd_store import Store

    meta = click.get_current_context().meta
    env = {
        e: meta.get(f"buildmatrix.{f[2:].replace('-', '_')}", "")
        for f, (e, _) in CONTAINERD_OPTIONS.items()
    }
    return Store.from_env(env)


def node_option(func: F) -> F:
    decorator = click.option(
        "--node",
        envvar="NODE_NAME",
        metavar="NAME",
        help="The node's name (default: $NODE_NAME, else the host name).",
    )
    return decorator(func)


def _taint_key(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A taint key as the API server validates one (kubernetes pkg/apis/core/validation
    ``validateNodeTaints``: ``ValidateLabelName``, apimachinery ``IsQualifiedName``)."""
    from buildmatrix.k8s_nodes import label_key_problem

    problem = label_key_problem(value)
    if problem is not None:
        raise click.BadParameter(
            f"'{value}' is not a taint key the API server accepts: it {problem} (a "
            "qualified name such as example.com/gpu-unverified, or under cluster-autoscaler's "
            "prefix startup-taint.cluster-autoscaler.kubernetes.io/NAME).",
            ctx=ctx,
            param=param,
        )
    return value


def taint_key_option(func: F) -> F:
    """``--taint-key KEY``: the admission taint's key (docs/kubernetes.md, Day 2)."""
    decorator = click.option(
        "--taint-key",
        default=TAINT_KEY,
        show_default=True,
        metavar="KEY",
        callback=_taint_key,
        help="The admission taint's key (effect NoSchedule). Managed cluster autoscalers "
        "(GKE, AKS) take no --startup-taint flag: there use a key under "
        "startup-taint.cluster-autoscaler.kubernetes.io/.",
    )
    return decorator(func)


def no_gfd_keys_option(func: F) -> F:
    """``--no-gfd-keys`` and ``--gfd-keys auto|always|never`` (labelkeys.GfdKeys)."""
    func = click.option(
        "--gfd-keys",
        "gfd_keys",
        type=click.Choice([m.value for m in GfdKeys]),
        default=None,
        help="Who writes GPU Feature Discovery's keys: auto (default) leaves them to GFD "
        "on a Node that carries GFD's nvidia.com/gfd.timestamp label (--apply), else "
        "writes them; always; never (GFD runs).",
    )(func)
    decorator = click.option(
        "--no-gfd-keys", is_flag=True, help="Leave out the keys GPU Feature Discovery owns."
    )
    return decorator(func)


def gfd_mode(no_gfd_keys: bool, gfd_keys: str | None) -> GfdKeys:
    """The --gfd-keys mode; --no-gfd-keys is --gfd-keys never."""
    if no_gfd_keys and gfd_keys not in (None, GfdKeys.NEVER.value):
        raise InputError(
            f"--no-gfd-keys and --gfd-keys {gfd_keys} contradict each other: --no-gfd-keys "
            "is --gfd-keys never; pass one of them."
        )
    if no_gfd_keys:
        return GfdKeys.NEVER
    return GfdKeys(gfd_keys) if gfd_keys else GfdKeys.AUTO


def given(option: str) -> bool:
    """Whether the user gave the current command's parameter ``option`` (its Python
    name), on the command line or in its environment variable, rather than its default."""
    from click.core import ParameterSource

    source = click.get_current_context().get_parameter_source(option)
    return source is not None and source is not ParameterSource.DEFAULT


def flag(option: str) -> str:
    """The current command's long flag for the parameter named ``option``."""
    for param in click.get_current_context().command.params:
        if param.name == option:
            return max(param.opts, key=len)
    raise KeyError(option)


def refuse_together(first: str, second: str, why: str) -> None:
    """Options that make no sense together are refused, naming both (``first`` and
    ``second`` as the user wrote them: flags, or a flag with its value), never one
    silently ignored."""
    raise InputError(f"{first} and {second} cannot be used together: {why}")


def load(profiles_dir: str | None) -> ProfileSet:
    # the loader only here: --version, --help and inspect start without it
    from buildmatrix.cuda import load_cuda_facts
    from buildmatrix.profile_files import load_profiles, resolve_profiles_dir

    return load_profiles(Path(resolve_profiles_dir(profiles_dir)), facts=load_cuda_facts())


def echo_error(message: str) -> None:
    """A one-paragraph error or failed check on stderr, as every command words it."""
    click.echo(f"buildmatrix: error: {message}", err=True)


def echo_json(payload: dict[str, Any]) -> None:
    """Print a JSON document; every one carries ``"version": 1``.

    Indented for a terminal; compact otherwise, which lets ``json`` use its C
    encoder (indenting 20,000 fatbin entries in pure Python takes ~1 s).
    """
    click.echo(json_text({"version": JSON_VERSION, **payload}))


def json_text(doc: Any) -> str:
    """Every command's JSON, documents and Kubernetes objects alike: indented for a
    terminal, compact otherwise (README, "Output")."""
    if sys.stdout.isatty():
        return json.dumps(doc, indent=2)
    return json.dumps(doc, separators=(",", ":"))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for row in [headers, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        lines.append("  ".join([*cells, str(row[-1])]).rstrip())
    return "\n".join(lines)


class ByteProgress:
    """Bytes read so far, on stderr, only when stderr is a terminal (thread-safe)."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self.total = 0
        self._last = 0.0
        self._lock = threading.Lock()

    def __call__(self, n: int) -> None:
        with self._lock:
            self.total += n
            now = time.monotonic()
            if self.enabled and now - self._last > 0.2:
                self._last = now
                click.echo(f"\rread {self.total / 2**20:,.0f} MiB", err=True, nl=False)

    def done(self) -> None:
        if self.enabled and self.total:
            click.echo("\r\033[K", err=True, nl=False)


MANIFEST_FORMATS = click.Choice(["yaml", "json"])


def dump_manifests(obj: Any, fmt: str) -> str:
    """One manifest, or a list of them: a multi-document stream in YAML, a v1 List in
    JSON."""
    import yaml

    class Plain(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True  # no &anchors: kubectl reads them, people and diffs less well

    if fmt == "json":
        # several objects are one v1 List, as kubectl prints and applies them (a bare
        # JSON array is no Kubernetes object)
        if isinstance(obj, list):
            obj = {"apiVersion": "v1", "kind": "List", "items": obj}
        return json_text(obj) + "\n"
    if isinstance(obj, list):
        return yaml.dump_all(obj, Dumper=Plain, sort_keys=False)
    return yaml.dump(obj, Dumper=Plain, sort_keys=False)
