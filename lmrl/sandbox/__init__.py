"""The code sandbox: untrusted Python (the `python` tool, the `code` reward) in an isolated process tree.

`runner` starts each execution and reports how it ended; `jail` (a standalone script, standard library only)
builds the namespaces, filesystem, limits and seccomp filter inside the new process; `verdict` checks unit-test
assertions in the trainer on values the sandboxed program returned (`operators`: the arithmetic it and the
calculator tool apply). docs/security.md: the threat model.
"""

from lmrl.sandbox.runner import (
    SandboxLimits,
    SandboxResult,
    extract_code,
    isolation_problem,
    network_namespace_available,
    require_isolation,
    run_python,
    run_tests,
)

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "extract_code",
    "isolation_problem",
    "network_namespace_available",
    "require_isolation",
    "run_python",
    "run_tests",
]
