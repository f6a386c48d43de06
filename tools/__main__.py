"""`python -m aa.tools`: the same as the `aa` command."""

import sys

from .cli import main

sys.exit(main())
