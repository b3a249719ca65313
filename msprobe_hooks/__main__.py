import sys

from msprobe_hooks.cli import main

sys.exit(main())
