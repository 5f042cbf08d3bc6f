"""JobSpec: the immutable description of a job, validated strictly at the door.

A spec is checked in two stages. The model itself enforces shape, types, units and internal
consistency (extra fields are rejected). `feasibility.check_feasible` then checks it against the
fleet and the team's quota, which are data the model cannot know.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpuyard.domain.units import parse_bytes, parse_cpu, parse_duration

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://.+$")

PRIORITY_CLASSES: dict[str, int] = {"low": 0, "normal": 1, "high": 2}

# Variables the launcher sets: which GPUs a worker sees (the NVIDIA container runtime exposes whatever
# NVIDIA_VISIBLE_DEVICES names, past the device plugin's allotment), the gang's rendezvous, gpuyard's own,
# and the worker's identity and scratch directory. A job setting one would escape its placement.
RESERVED_ENV_PREFIXES = ("GPUYARD_", "NVIDIA_", "PET_")
RESERVED_ENV_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NNODES",
        "NODE_RANK",
        "NPROC_PER_NODE",
        "HOME",
        "TMPDIR",
        "USER",
        "LOGNAME",
    }
)
# Plain `env` is shown by every read of the job: a credential belongs in `env_from_secret`.
_CREDENTIAL_WORDS = frozenset({"PASSWORD", "PASSWD", "SECRET", "TOKEN", "CREDENTIAL", "CREDENTIALS"})
_CREDENTIAL_PAIRS = ("API_KEY", "PRIVATE_KEY", "ACCESS_KEY")
MAX_SECONDS = 366 * 86400.0  # a year and a day: any duration past it is a typo, and overflows timedelta
MAX_CPU = 100_000.0
MAX_BYTES = 2**63 - 1  # what Kubernetes quantities and the store's integers hold


def dns_label(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"expected a lowercase DNS label (a-z, 0-9, '-', at most 63 characters), got {value!r}"
        )
    return value


def no_nul(value: str) -> str:
    # PostgreSQL text cannot hold these, nor can a process's argv or environment.
    if "\x00" in value:
        raise ValueError(f"NUL characters (\\u0000) are not allowed, got {value!r}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError(f"not valid Unicode (a lone surrogate), got {value!r}") from None
    return value


def env_name(name: str) -> None:
    """A variable a job may set: a valid name, not one the launcher owns."""
    if not _ENV_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid environment variable name")
    if name.startswith(RESERVED_ENV_PREFIXES) or name in RESERVED_ENV_NAMES:
        raise ValueError(
            f"{name!r} is reserved: the launcher sets it (GPU visibility, rendezvous, identity; "
            f"also every name starting with {', '.join(RESERVED_ENV_PREFIXES)})"
        )


def looks_like_credential(name: str) -> bool:
    upper = name.upper()
    return bool(_CREDENTIAL_WORDS & set(upper.split("_"))) or any(p in upper for p in _CREDENTIAL_PAIRS)


def _url(value: str) -> str:
    no_nul(value)
    if not _URL.match(value):
        raise ValueError(
            f"expected an fsspec URL with a scheme such as 'file:///...' or 's3://...', got {value!r}"
        )
    return value


def _quantity(
    parse: Callable[[Any], float], maximum: float, *, allow: tuple[str, ...] = ()
) -> Callable[[Any], Any]:
    """A validator that keeps the value as written (so specs round-trip) once `parse` accepts it
    and its amount is finite and at most `maximum` (1e400 parses as infinity)."""

    def validate(value: Any) -> Any:
        if value in allow:
            return value
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError(f"expected a string or a number, got {type(value).__name__}")
        amount = parse(value)
        if not math.isfinite(amount) or amount > maximum:
            raise ValueError(f"expected at most {maximum:g}, got {value!r}")
        return value

    return validate


Name = Annotated[StrictStr, AfterValidator(dns_label)]
Text = Annotated[StrictStr, AfterValidator(no_nul)]  # free text that is stored and may reach a process
Url = Annotated[StrictStr, AfterValidator(_url)]
ByteQuantity = Annotated[
    str | int, PlainValidator(_quantity(parse_bytes, MAX_BYTES), json_schema_input_type=str | int)
]
CpuQuantity = Annotated[
    str | int | float,
    PlainValidator(_quantity(parse_cpu, MAX_CPU), json_schema_input_type=str | int | float),
]
Duration = Annotated[
    str | int | float,
    PlainValidator(_quantity(parse_duration, MAX_SECONDS), json_schema_input_type=str | int | float),
]
Interval = Annotated[
    str | int | float,
    PlainValidator(
        _quantity(parse_duration, MAX_SECONDS, allow=("auto",)), json_schema_input_type=str | int | float
    ),
]


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DataAccess(_Value):
    """A dataset the job reads or writes; the scheduler places jobs where this access exists, and
    prefers a site holding what they read: a start elsewhere stages it there first, at the link's
    rate (`domain.sites`)."""

    uri: Url
    access: Literal["read", "write"] = "read"
    size: ByteQuantity | None = Field(
        None,
        description="Its size, e.g. '40G' or '1.5Ti': what a start at a site holding no copy of it "
        "stages there first (read data only); default: not known, nothing is charged.",
    )
    sites: tuple[Name, ...] = Field(
        (), description="The sites holding a copy of it; empty: every site reaches it alike."
    )

    @field_validator("sites")
    @classmethod
    def _sites_once(cls, sites: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(sites)) != len(sites):
            raise ValueError(f"a site is named twice: {list(sites)}")
        return sites

    @property
    def size_bytes(self) -> int | None:
        return None if self.size is None else parse_bytes(self.size)


MAX_GPUS = 4096  # per job: far below what the store's integers hold


class GpuRange(_Value):
    """An elastic job's sizes: at least `min` GPUs, at most `max` (each a multiple of `nodes`)."""

    min: StrictInt = Field(ge=1, le=MAX_GPUS, description="The size it is launched at.")
    max: StrictInt = Field(ge=1, le=MAX_GPUS, description="The most it may grow to.")


def _gpu_request(value: Any) -> int | GpuRange:
    """`gpus`: a number (0: CPU only), or `{min, max}` with 1 <= min <= max (an elastic job)."""
    if isinstance(value, GpuRange):
        return value
    if isinstance(value, dict):
        if set(value) != {"min", "max"}:
            raise ValueError(f"a range of GPUs is {{min: N, max: M}}, got the keys {sorted(map(str, value))}")
        low, high = value["min"], value["max"]
        for key, amount in (("min", low), ("max", high)):
            if not isinstance(amount, int) or isinstance(amount, bool):
                raise ValueError(f"{key}: expected an integer, got {amount!r}")
        if not 1 <= low <= high <= MAX_GPUS:
            raise ValueError(f"expected 1 <= min <= max <= {MAX_GPUS}, got min {low} and max {high}")
        return GpuRange(min=low, max=high)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(
            f"expected an integer, or {{min: N, max: M}} for an elastic job, got {type(value).__name__}"
        )
    if not 0 <= value <= MAX_GPUS:
        raise ValueError(f"expected a number greater than or equal to 0 and at most {MAX_GPUS}, got {value}")
    return value


# Checked by `_gpu_request` first (clear errors naming the field); the union then only types it.
GpuRequest = Annotated[Annotated[int, Field(ge=0, le=MAX_GPUS)] | GpuRange, BeforeValidator(_gpu_request)]


class Resources(_Value):
    """What one run needs. `gpus` is the total over all nodes and is split evenly across them.

    `gpus` may be a range, `{min, max}`: an elastic job, which runs at any size of the range that
    splits evenly over `nodes` (`sizes`). The model's `gpus` is then the size it is launched at,
    `min`, and `gpus_max` the most it may grow to: whatever reads `gpus` (placement, quota use, the
    store's `jobs.gpus`) reads the size the job starts at; admission reads `gpus_max`
    (docs/jobspec.md, "Elastic jobs").
    """

    model_config = ConfigDict(frozen=True, extra="forbid", serialize_by_alias=True)

    asked: GpuRequest = Field(
        1,
        alias="gpus",
        description="GPUs of the run over all its nodes (0: CPU only), or {min, max}: an elastic job.",
    )
    gpu_types: tuple[Text, ...] = Field(
        (), description="Accepted GPU types (e.g. a100, h100, cpu); empty accepts any type."
    )
    gpu_memory: ByteQuantity | None = Field(None, description="Minimum memory per GPU, e.g. '80Gi'.")
    nodes: StrictInt = Field(1, ge=1, le=1024)
    cpu: CpuQuantity | None = Field(None, description="CPU per node, e.g. 8 or '500m'.")
    memory: ByteQuantity | None = Field(None, description="Memory per node, e.g. '64Gi'.")

    @model_validator(mode="after")
    def _split_evenly(self) -> Resources:
        if isinstance(self.asked, GpuRange):
            ends = (("min", self.asked.min), ("max", self.asked.max))
            uneven = [f"{key} {gpus}" for key, gpus in ends if gpus % self.nodes]
            if uneven:
                raise ValueError(
                    f"gpus ({' and '.join(uneven)}) must split evenly over nodes ({self.nodes}): every node "
                    "of a gang runs the same number of workers, at every size of an elastic job"
                )
        elif self.gpus % self.nodes:
            raise ValueError(
                f"gpus ({self.gpus}) must split evenly over nodes ({self.nodes}): "
                "every node of a gang runs the same number of workers"
            )
        if len(set(self.gpu_types)) != len(self.gpu_types):
            raise ValueError(f"gpu_types lists a type twice: {list(self.gpu_types)}")
        return self

    @property
    def gpus(self) -> int:
        """The GPUs the job is launched with: `gpus`, or an elastic job's `min`."""
        return self.asked.min if isinstance(self.asked, GpuRange) else self.asked

    @property
    def gpus_max(self) -> int:
        """The most GPUs the job may hold: `gpus`, or an elastic job's `max`."""
        return self.asked.max if isinstance(self.asked, GpuRange) else self.asked

    @property
    def sizes(self) -> tuple[int, ...]:
        """Every size the job may run at, smallest first: one, or an elastic range's multiples of `nodes`."""
        return tuple(range(self.gpus, self.gpus_max + 1, self.nodes))

    @property
    def elastic(self) -> bool:
        """More than one size (`{min: 4, max: 4}` is one, as `gpus: 4`)."""
        return self.gpus_max > self.gpus

    @property
    def gpus_per_node(self) -> int:
        """At the launch size (`gpus`)."""
        return self.gpus // self.nodes

    @property
    def gpu_memory_bytes(self) -> int | None:
        return None if self.gpu_memory is None else parse_bytes(self.gpu_memory)

    @property
    def cpu_cores(self) -> float:
        """CPUs asked per node (0: none asked)."""
        return 0.0 if self.cpu is None else parse_cpu(self.cpu)

    @property
    def memory_gib(self) -> float:
        """Memory asked per node, in GiB (0: none asked)."""
        return 0.0 if self.memory is None else parse_bytes(self.memory) / 2**30


class RetryPolicy(_Value):
    """Failures of the job's own code use up `max_failures`; preemption and node loss never do. A
    job lost again and again (a flapping node) backs off and is capped per hour instead."""

    max_failures: StrictInt = Field(2, ge=0, le=100)
    backoff: Duration = Field("30s", description="Wait before retrying after a failure.")
    retryable_exit_codes: tuple[Annotated[StrictInt, Field(ge=-255, le=255)], ...] | None = Field(
        None, max_length=256, description="Exit codes worth a retry; null retries any failure."
    )
    lost_backoff: Duration = Field(
        "10s",
        description="Wait before resuming after a second loss (a node gone, a lease expired) within an "
        "hour, doubling with each further one; the first resumes at once.",
    )
    lost_per_hour: StrictInt = Field(
        6, ge=1, le=1000, description="Losses in any hour at most: after that many, the job waits."
    )


class CheckpointPolicy(_Value):
    """Where checkpoints go (never local disk in production) and how often they are taken."""

    url: Url
    interval: Interval = Field(
        "auto", description="'auto' (Young/Daly from measured cost and interruption rate) or a duration."
    )
    keep: StrictInt = Field(3, ge=1, le=1000, description="Newest checkpoints kept.")

    @property
    def interval_seconds(self) -> float | None:
        return None if self.interval == "auto" else parse_duration(self.interval)


class Liveness(_Value):
    """What may end a live attempt besides its lease (docs/concepts.md, "What keeps a job alive")."""

    progress_timeout: Duration | None = Field(
        None,
        description="Stop a job whose reported step has not advanced for this long, and count it as a "
        "failure (retried with backoff within max_failures). Only for jobs that heartbeat their step.",
    )

    @property
    def progress_timeout_s(self) -> float | None:
        return None if self.progress_timeout is None else parse_duration(self.progress_timeout)


class Reproducibility(_Value):
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1)
    code_version: Text | None = None
    data_snapshot: Text | None = None


class JobSpec(_Value):
    """An accepted JobSpec never changes; a change is a new job."""

    name: Name
    team: Name
    image: Text = Field(min_length=1, max_length=512)
    command: tuple[Text, ...] = Field(min_length=1, max_length=256)
    env: dict[Text, Text] = Field(
        default_factory=dict, description="Plain variables, shown by every read of the job: no credentials."
    )
    env_from_secret: dict[Text, Name] = Field(
        default_factory=dict,
        max_length=64,
        description="Variable -> name of a secret in the team's secret store; the value never leaves it "
        "except into the workers' environment.",
    )
    resources: Resources = Field(default_factory=Resources)
    priority: Literal["low", "normal", "high"] = "normal"
    preemptible: StrictBool = False
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    checkpoint: CheckpointPolicy | None = None
    data: tuple[DataAccess, ...] = ()
    sites: tuple[Name, ...] = Field((), description="Sites the job may run at; empty allows all.")
    tolerations: tuple[Text, ...] = Field((), description="Node taints this job accepts.")
    max_runtime: Duration | None = Field(
        None, description="Wall-clock limit counted from the job's first start, across attempts; not retried."
    )
    liveness: Liveness = Field(default_factory=Liveness)
    reproducibility: Reproducibility = Field(default_factory=Reproducibility)
    labels: dict[Text, Text] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _plain_env(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            env_name(key)
            if looks_like_credential(key):
                raise ValueError(
                    f"{key!r} looks like a credential, and env is shown by every read of the job: "
                    "store it as a team secret and name it in env_from_secret"
                )
        return env

    @field_validator("env_from_secret")
    @classmethod
    def _secret_env(cls, refs: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key in refs:
            env_name(key)
            if key in info.data.get("env", {}):
                raise ValueError(f"{key!r} is also set in env; set it in one place")
        return refs

    @property
    def max_runtime_s(self) -> float | None:
        return None if self.max_runtime is None else parse_duration(self.max_runtime)

    @property
    def priority_value(self) -> int:
        return PRIORITY_CLASSES[self.priority]

    def canonical_json(self) -> str:
        """The spec with every default filled in, keys sorted: equal specs give equal strings."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def fingerprint(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()


class SpecViolation(BaseModel):
    """One broken rule: where (a dotted field path) and what."""

    model_config = ConfigDict(frozen=True)

    path: str
    rule: str


class SpecRejected(ValueError):
    def __init__(self, violations: list[SpecViolation]):
        self.violations = violations
        super().__init__("; ".join(f"{v.path}: {v.rule}" for v in violations))

    @classmethod
    def one(cls, path: str, rule: str) -> SpecRejected:
        return cls([SpecViolation(path=path, rule=rule)])


def field_path(loc: tuple[int | str, ...]) -> str:
    # pydantic puts union branches and validator names into loc; keep only field names and indexes
    parts = [str(part) for part in loc if not (isinstance(part, str) and "[" in part)]
    return ".".join(parts) or "(root)"


def parse_spec(data: Any) -> JobSpec:
    """Validate a decoded document (dict from YAML or JSON) into a JobSpec or raise SpecRejected."""
    if not isinstance(data, dict):
        raise SpecRejected([SpecViolation(path="(root)", rule="expected a mapping of JobSpec fields")])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        violations: dict[str, SpecViolation] = {}
        for item in error.errors():
            path = field_path(item["loc"])
            message = item["msg"].removeprefix("Value error, ")
            violations.setdefault(path, SpecViolation(path=path, rule=message))
        raise SpecRejected(list(violations.values())) from None
