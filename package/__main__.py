"""`python -m kvscope …`, the same as the `kvscope` command."""

import sys

from kvscope.agent.app.cli import main

sys.exit(main())
