"""``python -m npudist`` = the ``npudist`` command."""
import sys

from npudist.cli import main

sys.exit(main())
