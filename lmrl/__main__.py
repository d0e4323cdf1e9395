import os
import sys

if os.environ.get("LMRL_LAUNCHER_PID"):  # a rank of `nproc=N`: die with the launcher, before the heavy imports
    from lmrl.parallel.parent import die_with_parent

    die_with_parent()

from lmrl.cli import main  # noqa: E402 - after the death signal is set

sys.exit(main())
