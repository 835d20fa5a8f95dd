"""The `gcloud` command lines for one Cloud TPU slice or a queued resource of several slices.

Every function returns an argv list; nothing here runs anything. Flag spellings follow the gcloud
reference pages `gcloud compute tpus tpu-vm {create,ssh,scp,describe,delete}` and
`gcloud compute tpus queued-resources {create,ssh,scp,describe,delete}`.

Zone and project are optional: when absent, gcloud uses its own defaults (`gcloud config set
compute/zone ...`, or the CLOUDSDK_COMPUTE_ZONE / CLOUDSDK_CORE_PROJECT environment variables).
"""

import dataclasses
import re

TPU_VM = ["gcloud", "compute", "tpus", "tpu-vm"]
QUEUED = ["gcloud", "compute", "tpus", "queued-resources"]

# TPU software versions for JAX (cloud.google.com/tpu/docs/runtimes). jax[tpu] and libtpu come from
# pip, so the base image of each generation is enough.
RUNTIME_VERSIONS = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}
# v2, v3, v4 and v5p accelerator types count TensorCores (two per chip); v5e and v6e count chips.
_CORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5litepod": 1, "v6e": 1}
# The slice sizes each generation's accelerator types name (cloud.google.com/tpu/docs/v2 ... /v6e): v2, v3, v5e and
# v6e come in these sizes only; v4 and v5p slices are any whole number of 4-chip hosts (8 TensorCores each).
_SLICE_SIZES = {"v2": (8, 32, 128, 256, 512), "v3": (8, 32, 64, 128, 256, 512, 1024, 2048),
                "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256), "v6e": (1, 4, 8, 16, 32, 64, 128, 256)}


@dataclasses.dataclass(frozen=True)
class Slice:
  """Where a job runs: one TPU VM slice, or a queued resource holding `node_count` slices.

  A queued resource named NAME holds one node also named NAME (node_count == 1), or nodes
  `<node_prefix>-0` ... `<node_prefix>-<N-1>` (Multislice; the prefix defaults to NAME).
  """
  name: str
  zone: str | None = None
  project: str | None = None
  queued: bool = False
  node_count: int = 1
  node_prefix: str | None = None

  def __post_init__(self):
    if self.node_count < 1:
      raise ValueError(f"node_count must be >= 1, got {self.node_count}")
    if self.node_count > 1 and not self.queued:
      raise ValueError("several slices (node_count > 1) need a queued resource (queued=True)")

  @property
  def node_names(self) -> list[str]:
    """The TPU VM node of each slice."""
    if self.node_count == 1:
      return [self.name]
    prefix = self.node_prefix or self.name
    return [f"{prefix}-{i}" for i in range(self.node_count)]

  def where(self) -> list[str]:
    """The zone and project flags every command takes."""
    flags = [f"--zone={self.zone}"] if self.zone else []
    return flags + ([f"--project={self.project}"] if self.project else [])


@dataclasses.dataclass(frozen=True)
class Hardware:
  """What to create: `accelerator_type` (v3-128), or `tpu_type` + `topology` (v4, 4x4x4)."""
  runtime_version: str | None = None
  accelerator_type: str | None = None
  tpu_type: str | None = None
  topology: str | None = None
  spot: bool = False
  preemptible: bool = False
  valid_until_duration: str | None = None  # queued resources only, e.g. "6h"
  extra_flags: tuple[str, ...] = ()        # passed through verbatim, e.g. "--network=NET"

  def __post_init__(self):
    if bool(self.accelerator_type) == bool(self.tpu_type and self.topology):
      raise ValueError("give either accelerator_type, or tpu_type and topology")
    if self.spot and self.preemptible:
      raise ValueError("--spot and --preemptible exclude each other")
    if self.accelerator_type:
      check_accelerator_type(self.accelerator_type)
      object.__setattr__(self, "accelerator_type", self.accelerator_type.lower())   # gcloud's spelling

  @property
  def generation(self) -> str:
    """TPU generation, e.g. "v4" for v4-128 or --type=v4."""
    name = self.accelerator_type.rsplit("-", 1)[0] if self.accelerator_type else self.tpu_type
    return name.lower()

  def runtime(self) -> str:
    """The --version / --runtime-version: given, or the generation's default."""
    if self.runtime_version:
      return self.runtime_version
    if self.generation not in RUNTIME_VERSIONS:
      raise ValueError(f"no default runtime version for {self.generation!r}: pass --version")
    return RUNTIME_VERSIONS[self.generation]

  def shape_flags(self) -> list[str]:
    """--accelerator-type, or --type and --topology."""
    if self.accelerator_type:
      return [f"--accelerator-type={self.accelerator_type}"]
    return [f"--type={self.tpu_type}", f"--topology={self.topology}"]


def check_accelerator_type(accelerator_type: str) -> tuple[str, int]:
  """(generation, size) of an accelerator type ("v3-128" -> ("v3", 128)); a ValueError for a type without a size
  (v3), or of a size that a generation known here does not come in (v3-100, v4-12, v5litepod-2), before gcloud is
  asked. The sizes of a generation not known here are left to gcloud (its runtime then needs --version)."""
  match = re.fullmatch(r"([a-z0-9]+)-(\d+)", accelerator_type.lower())
  if not match:
    raise ValueError(f"accelerator type {accelerator_type!r}: give GENERATION-SIZE, e.g. v3-128, v4-128, "
                     "v5litepod-256, v6e-256")
  generation, size = match.group(1), int(match.group(2))
  if generation in _SLICE_SIZES and size not in _SLICE_SIZES[generation]:
    raise ValueError(f"accelerator type {accelerator_type!r}: {generation} slices come as "
                     f"{', '.join(f'{generation}-{n}' for n in _SLICE_SIZES[generation])}")
  if generation in ("v4", "v5p") and (size < 8 or size % 8):
    raise ValueError(f"accelerator type {accelerator_type!r}: {generation} sizes count TensorCores, 8 a host "
                     f"(e.g. {generation}-8, {generation}-128)")
  return generation, size


def chips_and_hosts(accelerator_type: str) -> tuple[int, int]:
  """(chips, hosts) of one slice, e.g. "v3-128" -> (64, 16), "v5litepod-256" -> (256, 64).

  Hosts hold 4 chips, except single-host v5e/v6e slices of up to 8 chips
  (cloud.google.com/tpu/docs/v3, /v4, /v5e, /v6e).
  """
  generation, size = check_accelerator_type(accelerator_type)
  if generation not in _CORES_PER_CHIP:
    raise ValueError(f"unknown accelerator type {accelerator_type!r}")
  chips = size // _CORES_PER_CHIP[generation]
  single_host_chips = 8 if _CORES_PER_CHIP[generation] == 1 else 4
  return chips, 1 if chips <= single_host_chips else chips // 4


# --- lifecycle --------------------------------------------------------------------------------


def create(tpu: Slice, hw: Hardware) -> list[str]:
  """`tpu-vm create`, or `queued-resources create` for a queued resource."""
  if not tpu.queued:
    if hw.valid_until_duration:
      raise ValueError("--valid-until-duration needs a queued resource (--queued)")
    cmd = TPU_VM + ["create", tpu.name, *tpu.where(), *hw.shape_flags(), f"--version={hw.runtime()}"]
  else:
    nodes = ([f"--node-id={tpu.name}"] if tpu.node_count == 1 else
             [f"--node-count={tpu.node_count}", f"--node-prefix={tpu.node_prefix or tpu.name}"])
    cmd = QUEUED + ["create", tpu.name, *tpu.where(), *hw.shape_flags(),
                    f"--runtime-version={hw.runtime()}", *nodes]
    if hw.valid_until_duration:
      cmd.append(f"--valid-until-duration={hw.valid_until_duration}")
    if hw.preemptible:  # the queued-resources reference lists --spot, --guaranteed, --reserved only
      raise ValueError("a queued resource takes --spot, not --preemptible")
  cmd += ["--spot"] * hw.spot + ["--preemptible"] * hw.preemptible
  return cmd + list(hw.extra_flags)


def delete(tpu: Slice) -> list[str]:
  """Deletes without a prompt; a queued resource with `--force` also deletes its nodes."""
  if tpu.queued:
    return QUEUED + ["delete", tpu.name, *tpu.where(), "--force", "--quiet"]
  return TPU_VM + ["delete", tpu.name, *tpu.where(), "--quiet"]


def describe(tpu: Slice, fmt: str | None = None) -> list[str]:
  """The node (state, health) or the queued resource (state.state); `fmt` is a --format value."""
  if fmt is None:
    fmt = ("yaml(name,state,tpu.nodeSpec)" if tpu.queued else
           "yaml(name,acceleratorType,runtimeVersion,state,health,healthDescription)")
  return (QUEUED if tpu.queued else TPU_VM) + ["describe", tpu.name, *tpu.where(), f"--format={fmt}"]


def state_query(tpu: Slice) -> list[str]:
  """Prints one word: the node state (READY, PREEMPTED, ...) or the queued resource's (ACTIVE, ...)."""
  return describe(tpu, "value(state.state)" if tpu.queued else "value(state)")


# --- remote commands ----------------------------------------------------------------------------
# All take --quiet: gcloud then never prompts (a first SSH key is made without a passphrase), so an
# unattended supervisor cannot hang on a question.


def _everywhere(tpu: Slice) -> tuple[list[str], list[str]]:
  """The command group and the flags that reach every worker of every slice."""
  return (QUEUED, ["--node=all", "--worker=all"]) if tpu.queued else (TPU_VM, ["--worker=all"])


def ssh_all(tpu: Slice, command: str) -> list[str]:
  """Runs `command` on every worker of every slice at once."""
  group, everywhere = _everywhere(tpu)
  return group + ["ssh", tpu.name, *tpu.where(), "--quiet", *everywhere, f"--command={command}"]


def ssh_one(tpu: Slice, command: str, worker: int | str = 0, node: int = 0) -> list[str]:
  """Runs `command` on one worker (or "all" workers) of one slice (a queued resource's node)."""
  return TPU_VM + ["ssh", tpu.node_names[node], *tpu.where(), "--quiet", f"--worker={worker}",
                   f"--command={command}"]


def scp_to_all(tpu: Slice, local_path: str, remote_path: str) -> list[str]:
  """Copies a local file to `remote_path` (relative to the home directory) on every worker."""
  group, everywhere = _everywhere(tpu)
  return group + ["scp", local_path, f"{tpu.name}:{remote_path}", *tpu.where(), "--quiet", *everywhere]


def scp_from(tpu: Slice, remote_path: str, local_path: str, worker: int, node: int = 0) -> list[str]:
  """Copies `remote_path` from one worker of one slice to `local_path`."""
  return TPU_VM + ["scp", f"{tpu.node_names[node]}:{remote_path}", local_path, *tpu.where(),
                   "--quiet", f"--worker={worker}"]
