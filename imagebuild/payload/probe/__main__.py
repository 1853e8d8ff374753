"""`python -m imagebuild.probe`: the probe's command line, as the zipapp's own __main__.py runs it."""

import sys

from .cli import main

sys.exit(main())
