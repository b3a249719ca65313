import sys

from msprobe_hooks.cli.command import main

sys.exit(main())
