"""`python tests/launch_cli.py ARGS` = `mlmt-bench ARGS` with the test verifier `parity-test` registered."""

import sys

from mlmt_bench import registry

registry.verifiers.register("parity-test", "support:ParityVerifier", "parity of the response length (tests)")

from mlmt_bench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.argv = ["mlmt-bench", *sys.argv[1:]]
    main()
