"""Sandbox runner: the trusted "judge" process and the untrusted candidate process.

This package is what the judge process runs: :mod:`mlmt_bench.verifiers.sandbox` zips it
(``judge/*.py`` as the package ``_sandbox_judge``, plus a ``__main__`` that calls
:func:`.supervisor.judge_main`) into a memfd and runs ``python -I -S -B /dev/fd/N``. So its
modules use the standard library only, import nothing from ``mlmt_bench``, import one another
relatively, and are all imported before the judge closes that descriptor and forks (the jail
shows no file of them). The host imports it only for :func:`encode_value` /
:func:`decode_value`, the constants and the cgroup clean-up.

Modules, by job: :mod:`.wire` (frames; values as plain data, hash-collision checks),
:mod:`.jail` (namespaces, mounts, cgroups, the jail's plan and build, rlimits, the uid drop),
:mod:`.probe` (which of those work here), :mod:`.candidate` (the candidate process C),
:mod:`.rewrite` and :mod:`.evaluator` (the test evaluator E: test rewriting, its channel to C,
its loop), :mod:`.supervisor` (the judge process J).

Process layout (one run = one program and its tests)::

    host (pytest / trainer thread)
      └─ judge  J   this package; new session; root; reads its config from stdin; runs no test
           ├─ evaluator E   fork of J; isolated like C, with a uid of its own; evaluates the tests
           └─ candidate C   fork of J; isolated; runs setup + program; answers E's eval requests

J only supervises: it makes the run's cgroups, forks E and C, hands the tests to E, waits for
E's report (killing E ``EVAL_GRACE_S`` after E's own deadline, whatever E is doing), kills what
is left and writes the verdict for the host. J never parses a value from C, and what E reports
is checked as data: the tests may come with the input (a ``verify`` line, a dataset) and be as
untrusted as the program, so they run in E, never as root on the host. E is in the run's memory
and pids cgroups, a network namespace and a jail of its own (without /proc), under rlimits,
no_new_privs and a private uid; it is not in C's PID namespace (it must outlive C's init), so
J, a child subreaper, kills E's leftovers itself.

Why candidates cannot fake a pass
---------------------------------
The expected values never enter C. E parses every test (``assert f(3) == 5``) and evaluates it
itself; only the sub-expressions that involve the candidate's names (``f(3)``) are sent to C as
source text over a pipe, and C answers with a *value*, encoded as plain data (ints, strings,
lists, dicts ...). E decodes it into fresh builtin objects (a frame of at most ``MAX_FRAME``
bytes and ``MAX_STRUCTURE`` JSON separators, counted before it is parsed; no dict or set whose
keys were forged to share one hash value) and does the comparison, the ``assert`` and any
helper calls (``math.isclose``, ``set`` ...) with its own, untouched interpreter. (Below, "J"
is the trusted side that evaluates the tests: E, forked from J.) So:

* overriding ``__eq__`` / ``__bool__`` on a returned object is useless: the object never leaves C,
  only its plain-data encoding does (custom objects cannot be encoded and fail the test);
* monkeypatching ``assert``/builtins/``print``/``AssertionError`` only changes C, not J;
* ``sys.exit(0)``, ``os._exit(0)``, signals, crashes before or during the tests just mean that
  the requests are never answered: those tests fail;
* the tests are never in C's memory, on its filesystem, command line or environment: J reads
  them from its stdin *after* forking C, and C closes that stdin before running anything;
  frame inspection (``sys._getframe(1)``) only sees the request, not the expected value;
* anything C writes on the result pipe is treated as untrusted data (a forged "answer" is just a
  value, and C does not know the expected one). Verdicts travel only from J to the host, on J's
  stdout, tagged with a nonce that the host sends after C and E have been forked.

Isolation of C (each step is used when the host's probe found it working; see :mod:`.probe`):
own uid/gid (a random unprivileged uid per run, so RLIMIT_NPROC is enforced and kill(-1) as
that uid reaches only this run), no_new_privs, new PID namespace (C is its init: when it dies
the kernel kills every descendant, including double-forked / setsid daemons), new network
namespace (no interfaces but a down loopback), new mount/IPC/UTS namespaces with a chroot jail
on a private tmpfs (read-only binds of only what the interpreter needs to start and import its
standard library, see :func:`.jail.jail_plan`; a minimal /dev, a fresh /proc; writable only /sandbox (the
cwd), /tmp, /var/tmp, /dev/shm inside the tmpfs, which vanish with the namespace), rlimits
(CPU, AS, NPROC, FSIZE, NOFILE, CORE), a scrubbed environment, stdin from /dev/null,
stdout/stderr read by J up to a cap, and a Python audit hook that refuses sockets (and reports
the attempt, so the verdict is ``sandbox_violation``).
"""

from __future__ import annotations

from .supervisor import EVAL_GRACE_S
from .wire import MAX_FRAME, DecodeError, EncodeError, Opaque, decode_value, encode_value

__all__ = ["EVAL_GRACE_S", "MAX_FRAME", "DecodeError", "EncodeError", "Opaque", "decode_value", "encode_value"]
