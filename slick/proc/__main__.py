"""``python -m slick.proc --parent-pid PID --module MOD -- ARGS`` (:func:`slick.proc.children.main`)."""
import sys

from slick.proc.children import main

sys.exit(main())
