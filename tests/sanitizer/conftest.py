import os
import sys

# The spawn-with-timeout helper the plan tests use (tests/plan/dist_helpers.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plan"))
