"""Reads its stdin and never answers anything (not even initialize)."""

import sys

for _line in sys.stdin:
    pass
