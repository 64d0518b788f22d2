"""Shared command-line plumbing for the ``python -m jaxdqn.<program>`` entry points.

Every program takes the same configuration arguments::

    python -m jaxdqn.<program> [--config PATH] [key=value ...]

``--config`` names a YAML file (default: the embedded defaults, identical to
``configs/default.yaml``); each ``key=value`` overrides one dotted config key
(``data.source=synthetic env.max_leverage=2``). ``--help`` lists every config key with its
default and meaning. A user error — bad config (:class:`~jaxdqn.config.ConfigError`) or bad
data (:class:`~jaxdqn.market.data.DataError`) — ends the program with ONE line on stderr and exit
code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from jaxdqn import config as config_lib
from jaxdqn.config import Config, ConfigError
from jaxdqn.market.data import DataError

__all__ = [
    "USER_ERRORS",
    "add_checkpoint_argument",
    "checkpoint_choice",
    "config_help",
    "load_config",
    "make_parser",
    "require_test_walk",
    "run_main",
]

# Errors caused by the user's input; everything else is a bug and keeps its traceback.
USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError)


def config_help() -> str:
    """A table of every config key: dotted name, default and meaning (``describe()`` rows)."""
    rows = config_lib.describe()
    width = max(len(k) for k, _, _ in rows)
    dwidth = min(max(len(d) for _, d, _ in rows), 24)
    lines = ["config keys (override with key=value):"]
    for key, default, help_ in rows:
        lines.append(f"  {key:<{width}}  {default:<{dwidth}}  {help_}")
    return "\n".join(lines)


def make_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An argument parser with ``--config PATH``, ``key=value`` overrides and the key list.

    Programs may add their own arguments to the returned parser before parsing.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=config_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=None,
        help="YAML config file (default: the embedded default = configs/default.yaml)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted config overrides, e.g. data.source=synthetic env.max_leverage=2",
    )
    return parser


def require_test_walk(cfg: Config, program: str) -> None:
    """Raises ConfigError when ``cfg`` has ``eval.walk_test=false`` and ``program`` judges its
    runs on test (a walk-forward's folds, an ablation's variants)."""
    if not cfg.eval.walk_test:
        raise ConfigError(
            f"eval.walk_test=false: {program} judges its runs on their test walks (false is "
            "for a sweep's trials: python -m jaxdqn.sweep)"
        )


def add_checkpoint_argument(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint best|latest|STEP`` (default best), read with :func:`checkpoint_choice`."""
    parser.add_argument(
        "--checkpoint", default="best", help="best | latest | a checkpoint step (default best)"
    )


def checkpoint_choice(text: str) -> str | int:
    """``--checkpoint``'s value: ``"best"``, ``"latest"`` or a step number.

    Raises:
      ConfigError: anything else.
    """
    if text in ("best", "latest"):
        return text
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"--checkpoint: expected best, latest or a step number, got {text!r}"
        ) from None


def load_config(args: argparse.Namespace) -> Config:
    """The :class:`Config` named by parsed ``--config`` and ``key=value`` arguments."""
    return config_lib.load(args.config, args.overrides)


def run_main(prog: str, main: Callable[[Sequence[str] | None], int | None], argv=None) -> int:
    """Call ``main(argv)``; turn a user error into one stderr line and exit code 2.

    Returns the exit code (0 when ``main`` returns ``None``), so an entry point reads
    ``sys.exit(run_main("jaxdqn.x", _main, argv))``.
    """
    try:
        code = main(argv)
    except USER_ERRORS as e:
        msg = " ".join(str(e).split())  # one line whatever the message contains
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 2
    return 0 if code is None else int(code)
