"""The test harness that runs INSIDE the sandbox for HumanEval / MBPP rows (stdlib only, any Python 3).

code_execution.py sends this file's source as the sandbox program and three kinds of inputs as open
file descriptors, whose numbers follow the program in `sys.argv`:
    argv[1]   the per-run pass marker (random; the parent looks for it in stdout)
    argv[2]   the source to run: the model's code followed by the tests (MBPP strict, HumanEval), or
              the model's code alone (MBPP pass_fraction)
    argv[3:]  pass_fraction only: one assert statement each, run one by one after the source.
Every descriptor is read and closed BEFORE any model code runs, so the marker is in no file, argument,
environment variable or descriptor the model's code can read: a completion that reads its own program
and prints what it finds, then exits 0, prints no marker and scores 0.0. The marker is written only
after the tests ran without an exception (`sys.exit()`/`os._exit()` before that prints nothing).

Residual risk (docs/rewards.md): the model's code runs in this interpreter, so code written to attack
the harness can still find the marker in memory (`sys._getframe(1).f_locals`, `gc`, /proc/self/mem);
a separate process could not hold the marker any safer, because whatever reports "the tests ran" runs
beside the model's code.
"""

import builtins
import os
import sys


def _take(fd):
    """All bytes of one inherited descriptor, which is then closed."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _report(write, line):
    """One line on fd 1, after whatever the model's code left buffered (on its own line)."""
    try:
        sys.stdout.flush()
    except BaseException:  # noqa: BLE001, S110 - the model's code may have closed or replaced sys.stdout
        pass
    write(1, b"\n" + line + b"\n")


def main():
    write = os.write  # kept before the model's code can replace os.write
    fds = [int(arg) for arg in sys.argv[1:]]
    marker = _take(fds[0])
    source = _take(fds[1]).decode("utf-8")
    tests = [_take(fd).decode("utf-8") for fd in fds[2:]]
    del fds
    sys.argv = sys.argv[:1]
    module = type(sys)("__main__")  # a fresh __main__ for the model's code, as if run as a script
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    namespace = module.__dict__
    # running the model's code is this file's job (inside the sandbox); an exception propagates: no marker
    exec(compile(source, "<solution>", "exec"), namespace)  # noqa: S102
    if not tests:
        _report(write, marker)
        return
    for index, test in enumerate(tests):
        try:
            exec(compile(test, f"<test {index}>", "exec"), namespace)  # noqa: S102
        except BaseException:  # noqa: BLE001, S112 - a failed assert (or exit) only loses this test's point
            continue
        _report(write, marker + b":%d" % index)


if __name__ == "__main__":
    main()
