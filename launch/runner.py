"""Running commands, or printing them (`--dry-run`).

Everything the launcher does goes through a runner, called with an argv list; tests pass a fake.
"""

import dataclasses
import shlex
import subprocess
import sys
from typing import Protocol, TextIO


@dataclasses.dataclass(frozen=True)
class Result:
  """Exit status and, when captured, output of one command."""
  returncode: int
  stdout: str = ""
  stderr: str = ""
  dry_run: bool = False   # printed, not run (`DryRun`): its empty output says nothing of the command

  @property
  def ok(self) -> bool:
    """Whether the command exited with status 0."""
    return self.returncode == 0


class Runner(Protocol):
  """Anything that runs (or prints) an argv: `Subprocess`, `DryRun`, or a test fake."""

  def __call__(self, argv: list[str], *, capture: bool = False) -> Result:
    """Runs argv; with `capture`, returns its output instead of showing it."""


class Subprocess:
  """Runs each command, its output going to the terminal unless captured."""

  def __call__(self, argv: list[str], *, capture: bool = False) -> Result:
    done = subprocess.run(argv, capture_output=capture, text=True, check=False)
    return Result(done.returncode, done.stdout or "", done.stderr or "")


@dataclasses.dataclass
class DryRun:
  """Prints each command, shell-quoted on one line, instead of running it."""
  out: TextIO | None = None  # default: sys.stdout at the time of printing

  def __call__(self, argv: list[str], *, capture: bool = False) -> Result:
    del capture  # nothing runs, so there is nothing to capture
    print(shlex.join(argv), file=self.out or sys.stdout)
    return Result(0, dry_run=True)

  def comment(self, text: str) -> None:
    """Prints `# text` between the commands of a dry run."""
    print(f"# {text}", file=self.out or sys.stdout)
