import os
import sys

# launcher.py / worker.py live next to the tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
