"""``exactpack`` command line, thin over the library: each subcommand is a pair ``(add_NAME,
cmd_NAME)`` in :data:`COMMANDS`; the packing flags come from the option classes
(:mod:`exactpack.cli.flags`); a refusal is one line and exit code 2."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from exactpack.cli.demo import add_demo, cmd_demo
from exactpack.cli.flags import in_flags
from exactpack.cli.pack import add_pack, add_stats, cmd_pack, cmd_stats
from exactpack.cli.show import add_show, cmd_show
from exactpack.cli.verify import add_verify, cmd_verify
from exactpack.core.errors import ExactpackError, did_you_mean, is_foreign, why
from exactpack.io.atomic import SIGNALLED
from exactpack.pipeline.progress import printable

Command = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


COMMANDS: dict[str, tuple[str, Command]] = {
    "demo": ("pack the seed's A/B/C fixture and print its JSON trace", (add_demo, cmd_demo)),
    "pack": ("pack a dataset into Parquet shards of rows + manifest", (add_pack, cmd_pack)),
    "stats": ("compare every policy on a dataset without writing rows", (add_stats, cmd_stats)),
    "show": ("print (and draw) one row of a packed folder", (add_show, cmd_show)),
    "verify": (
        "prove a model computes the same on packed rows as on separate examples",
        (add_verify, cmd_verify),
    ),
}


class UsageError(Exception):
    """A command line argparse refused; ``str()`` is its one-line message."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a refusal is :class:`UsageError` (one line, exit 2), not usage + error;
    an unknown flag is answered with the closest one (``did you mean --max-length?``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: dict[str, OneLineParser] = {}  # the subcommands' parsers, by name

    def unknown(self, extra: Sequence[str]) -> UsageError:
        """The refusal of ``extra`` (what parsing left over), with the closest flag."""
        flags = [s for action in self._actions for s in action.option_strings]
        typos = [e.partition("=")[0] for e in extra if e.startswith("--")]
        hint = next((h for h in (did_you_mean(t, flags) for t in typos) if h), "")
        return UsageError(
            f"{self.prog}: error: unrecognized arguments: {' '.join(extra)}{hint}"
            f" (see {self.prog} --help)"
        )

    def error(self, message: str) -> NoReturn:
        # "argument --max-length: --max-length 'x' is not ..." names the flag twice
        flag, sep, rest = message.partition(": ")
        if sep and flag.startswith("argument ") and rest.startswith(flag[len("argument ") :]):
            message = rest
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="exactpack",
        description="Pack tokenized examples into shared rows without joining their contexts.",
    )
    import exactpack

    parser.add_argument("--version", action="version", version=f"exactpack {exactpack.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, (add, _)) in COMMANDS.items():
        parser.commands[name] = sub.add_parser(name, help=help_text, description=help_text)
        add(parser.commands[name])
    return parser


def _one_line(err: BaseException) -> str:
    """The message on one line, control characters (of a file name) escaped."""
    return printable(" ".join(str(err).split()))


def _terminated(signum: int, frame: object) -> None:
    # SystemExit unwinds (a half-written output is removed); remembered in case a library
    # swallows it (a __del__, an import catching BaseException): the output is then never
    # committed, and a later error or a normal return still reads as termination
    SIGNALLED.append(signum)
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _warnings_as_lines(command: str) -> Iterator[None]:
    """A library warning (e.g. a tokenizer setting turned off) as one ``warning:`` line."""

    def show(message: Warning | str, *_: object, **__: object) -> None:
        line = _one_line(Exception(in_flags(str(message))))
        print(f"exactpack {command}: warning: {line}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Usage and library errors, and a foreign error no reader translated
    (json, Arrow, msgspec: :func:`~exactpack.core.errors.is_foreign`): one line, exit 2; OS
    errors (the machine's, not the input's: a full disk): one line, exit 1; SIGTERM and
    Ctrl-C unwind, removing temporary output (143, 130)."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # name the subcommand, as its own refusals do
            raise parser.commands[args.command].unknown(extra)
    except UsageError as err:
        print(_one_line(err), file=sys.stderr)
        return 2
    _, (_, run) = COMMANDS[args.command]
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    SIGNALLED.clear()
    try:
        with _warnings_as_lines(args.command):
            code = run(args)
        if SIGNALLED:  # swallowed on the way, and the run went on
            print(f"exactpack {args.command}: terminated", file=sys.stderr)
            return 128 + SIGNALLED[-1]
        return code
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print(f"exactpack {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if SIGNALLED:
            print(f"exactpack {args.command}: terminated", file=sys.stderr)
            return 128 + SIGNALLED[-1]
        if not isinstance(err, ExactpackError) and not is_foreign(err):
            raise
        # the library speaks Python keywords (cut_long=True); here, their flags (--cut-long);
        # an OS error names its file
        text = str(err) if isinstance(err, OSError) else f"{type(err).__name__}: {why(err)}"
        text = in_flags(str(err)) if isinstance(err, ExactpackError) else text
        print(f"exactpack {args.command}: error: {_one_line(Exception(text))}", file=sys.stderr)
        return 1 if isinstance(err, OSError) else 2
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        SIGNALLED.clear()  # a library call after this command commits as usual


if __name__ == "__main__":
    sys.exit(main())
