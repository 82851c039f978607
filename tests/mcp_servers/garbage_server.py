"""Writes lines that are not JSON-RPC and never answers."""

import sys
import time

for _line in sys.stdin:
    sys.stdout.write("this is not json {{{\n")
    sys.stdout.flush()
time.sleep(60)
