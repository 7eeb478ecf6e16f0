"""Moved to ``npudist.diagnosis.place`` (docs/architecture.md's layout);
this path stays an alias of that module for one release, so scripts that import it keep working
(tests/test_moved_paths.py)."""

import sys

from npudist.diagnosis import place as _moved

sys.modules[__name__] = _moved
