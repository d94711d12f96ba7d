import sys

from hcsim.cli import main

sys.exit(main())
