"""Stopping a long command cleanly on Ctrl-C (SIGINT) or SIGTERM.

The first signal only sets :attr:`StopSignals.received`: the command finishes the unit of work it is in (an
evaluation window, a needle trial), keeps what it has and ends with :class:`Interrupted` (exit code 128 + the
signal's number, 130 for Ctrl-C). A second signal stops at once: KeyboardInterrupt, which the command turns into
:meth:`Interrupted.at_once`, keeping nothing. ``genolc finetune`` stops the same way (genolc.train.loop).
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from genolc.errors import GenolcError


class Interrupted(GenolcError):
    """The user stopped the command; the message says what was kept. ``kept`` is the summary of the results written
    before stopping (None when nothing was), so the command can still print them."""

    run_status = "interrupted"

    def __init__(self, what: str, signum: int = signal.SIGINT, where: str | None = None, fix: str | None = None,
                 kept: dict[str, Any] | None = None):
        super().__init__(what, where=where, fix=fix)
        self.exit_code = 128 + signum       # the shell convention for a process ended by a signal
        self.kept = kept

    @classmethod
    def at_once(cls, command: str, where: str | None = None) -> "Interrupted":
        return cls(f"{command} stopped at once (a second Ctrl-C, or one before the first piece of work finished); "
                   "nothing was written", where=where,
                   fix="run it again (once work is under way, a single Ctrl-C stops after the current piece of work "
                       "and keeps what is done)")


class StopSignals:
    """While active, the first SIGINT or SIGTERM sets ``received`` and prints ``announce`` (after the signal's name);
    a second one raises KeyboardInterrupt.

    Installed only in the main thread (Python delivers signals there) and not over a signal the parent process
    set to be ignored (e.g. SIGINT for a background job).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, announce: str) -> None:
        self.announce = announce
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received is not None else ""

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            if handler is not None:          # None: a handler installed outside Python, which cannot be put back
                signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum
        from tqdm import tqdm

        # tqdm.write prints above a progress bar instead of through it.
        tqdm.write(f"{signal.Signals(signum).name} received: {self.announce} (send it again to stop at once, "
                   "keeping nothing)", file=sys.stderr)
