"""The ``datamask`` command: a thin skin over the library.

    datamask select   --input docs.parquet --output out/selection.parquet
    datamask evaluate --input docs.parquet --selection out/selection.parquet
    datamask report   --input docs.parquet --selection out/selection.parquet --output out/page
    datamask bench    --input docs.parquet --output out/bench
    datamask embed    --input docs.jsonl   --output docs.parquet
    datamask apply    --input docs.parquet --selection out/selection.parquet --output out/kept

Each command is one call of its library door (``select`` in :mod:`datamask.api`, the
others in :mod:`datamask.doors`): the flags and the ``--config`` file make its spec; the
door claims the output and stages remote paths.

Bad input prints one line, ``datamask: error: ...``, and exits with status 2; object
storage that stays unavailable through every retry (:mod:`datamask.io.retry`), a full disk
or another I/O error prints one line and exits with status 1 (rerun to resume).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from .._version import __version__
from ..io.retry import StorageUnavailable, is_transient, unavailable
from ..objectives.registry import import_term_modules
from .apply import add_apply_parser, run_apply
from .bench import add_bench_parser, run_bench
from .config_file import load_config
from .embed import add_embed_parser, run_embed
from .evaluate import add_evaluate_parser, run_evaluate
from .interrupt import exit_status, interrupted_line, terminate_on_sigterm
from .report import add_report_parser, run_report
from .select import add_select_parser, run_select

__all__ = ["EXIT_BAD_INPUT", "EXIT_IO_ERROR", "build_parser", "main"]

EXIT_BAD_INPUT = 2
#: Exit status when writing failed (full disk, I/O error) after the checks at the door.
EXIT_IO_ERROR = 1


def _one_line(exc: BaseException) -> str:
    """An error message on one line, whatever produced it."""
    text = " ".join(str(exc).split())
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        text = f"{exc.strerror}: {str(exc.filename)!r}."
    return text or type(exc).__name__


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; flags of settings come from :mod:`datamask.config`."""
    parser = argparse.ArgumentParser(
        prog="datamask",
        description="Joint quality + diversity selection of pre-training data (DATAMASK).",
    )
    parser.add_argument("--version", action="version", version=f"datamask {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_select_parser(sub)
    add_evaluate_parser(sub)
    add_report_parser(sub)
    add_bench_parser(sub)
    add_apply_parser(sub)
    add_embed_parser(sub)
    return parser


def _config_and_user_terms(argv: Sequence[str] | None) -> dict[str, Any] | Exception | None:
    """Read the ``--config`` file (the one read of it) and import the ``--term-module``
    modules it and the flags name, before the parser is built, so that the flags of their
    terms' parameters exist (a failing import is reported like any bad input). Returns the
    file's settings, the error reading it (``select`` reports it) or None."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--term-module", "--term_module", dest="term_modules", action="append")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    modules = list(known.term_modules or ())
    config: dict[str, Any] | Exception | None = None
    if known.config:
        try:
            config = load_config(known.config)
        except ValueError as exc:
            config = exc
        else:
            from_file = config.get("term_modules") or []
            modules += [from_file] if isinstance(from_file, str) else list(from_file)
    import_term_modules(modules)
    return config


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``datamask`` command. Returns the exit status."""
    try:
        config = _config_and_user_terms(argv)
    except ImportError as exc:
        print(f"datamask: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "config", None) is not None:
        if isinstance(config, Exception):
            print(f"datamask: error: {_one_line(config)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        args.config_values = config
    with terminate_on_sigterm(), warnings.catch_warnings():  # SIGTERM unwinds like Ctrl-C
        warnings.showwarning = _warning_line
        return _run(args)


def _warning_line(message: Warning | str, *_: object, **__: object) -> None:
    """A library warning as one line on stderr (no source line, no file name)."""
    print(f"datamask: warning: {_one_line(Exception(str(message)))}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; bad input and I/O errors become one line and a status."""
    commands = {
        "apply": run_apply,
        "select": run_select,
        "evaluate": run_evaluate,
        "report": run_report,
        "bench": run_bench,
        "embed": run_embed,
    }
    try:
        return commands[args.command](args)
    except StorageUnavailable as exc:  # never bad input: the same command resumes
        print(f"datamask: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_IO_ERROR
    except (ValueError, TypeError, FileNotFoundError, ImportError, json.JSONDecodeError) as exc:
        print(f"datamask: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # stdout closed early (e.g. `| head`): the work itself is done
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a full disk or a vanished folder while writing: nothing written
        if is_transient(exc):  # a store's fault no retry layer caught: said as such
            exc = unavailable("an operation of this run", exc, 1)
        print(f"datamask: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_IO_ERROR
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (cli/interrupt.py)
        print(f"datamask: {interrupted_line(args, exc)}", file=sys.stderr)
        return exit_status(exc)
