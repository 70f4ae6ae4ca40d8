"""One call in a child process forked from the engine core: the only kind of grammar work that can be
paused, resumed and killed.

xgrammar compiles in one C++ call that cannot be interrupted: in a thread, a compile runs to its end
(minutes, for a pathological schema) after every request that wanted it has failed, holding its
thread and the memory it built. A child process can be stopped (SIGSTOP), continued and killed, and
everything it allocated goes back to the system when it ends.

Forked, not spawned: the child inherits the grammar engine and the vocabulary already loaded (a
spawned one would import torch and xgrammar again: seconds, and hundreds of MB). The engine core has
threads (torch's, ZMQ's, the compile threads); a forked child has only the one that forked it, so it
runs nothing but the function it was given, writes the pickled answer to a pipe and leaves with
os._exit (no atexit handlers, no ZMQ teardown). It dies with the thread that forked it
(PR_SET_PDEATHSIG), so a killed engine core leaves no compile behind.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

SLOW_NICE = 10  # a compile past its quantum runs on the CPU the step loop leaves
_PR_SET_PDEATHSIG = 1
try:
    # Looked up now: a dlopen in the child could wait forever on a loader lock some other thread of
    # the engine core held when it forked.
    _PRCTL: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None
# Python 3.12 warns at every fork of a process with threads; the child here runs only `fn`, as above.
warnings.filterwarnings("ignore", r".*use of fork\(\) may lead to deadlocks", DeprecationWarning)


class ChildCall:
    """`fn(*args)` running in a forked child. `fd` becomes readable as its answer arrives; `read()`
    says when it is whole, and `result()` then reaps the child and returns (True, value) or
    (False, (param, message)) for an exception (param: the exception's `param`, or None)."""

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            _child_main(read_fd, write_fd, parent, fn, args)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        self.pid, self.fd = pid, read_fd
        self._chunks: list[bytes] = []

    def read(self) -> bool:
        """Take what the pipe holds; True once the child has closed it (answered, or died)."""
        while True:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                return False
            if not chunk:
                return True
            self._chunks.append(chunk)

    def result(self) -> tuple[bool, Any]:
        """After `read()` returned True: reap the child; its answer."""
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        try:
            return pickle.loads(b"".join(self._chunks))
        except Exception:  # noqa: BLE001 - no whole answer: the child died before it could send one
            return False, (None, f"the compile process ended without an answer ({_describe(status)})")

    def lower_priority(self) -> None:
        """From now on the child runs only on CPU that nothing else of normal priority wants."""
        try:
            os.setpriority(os.PRIO_PROCESS, self.pid, SLOW_NICE)
        except (ProcessLookupError, PermissionError):  # gone already; or not ours to lower
            pass

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """End the child now (stopped or not) and reap it."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.fd)


def _child_main(read_fd: int, write_fd: int, parent: int, fn: Callable[..., Any], args: tuple) -> NoReturn:
    """The child's whole life: call, answer, exit. Never returns, whatever happens."""
    code = 1
    try:
        os.close(read_fd)
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the engine core died before the line above took effect
            os._exit(1)
        # Ctrl-C reaches the whole process group: the engine core ends its compiles itself.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            answer: tuple[bool, Any] = (True, fn(*args))
        except BaseException as e:  # noqa: BLE001 - the answer carries it to the engine core
            answer = (False, (getattr(e, "param", None), str(e) or type(e).__name__))
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(pickle.dumps(answer))
        code = 0
    finally:
        os._exit(code)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}: {signal.strsignal(os.WTERMSIG(status))}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
