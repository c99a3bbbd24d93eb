import sys

from servekit.cli.commands import main

sys.exit(main())
