"""Worker that announces its pid and then waits to be stopped."""
import os
import time

print(f"ALIVE rank={os.environ['RANK']} pid={os.getpid()}", flush=True)
time.sleep(float(os.environ.get("SLEEP", "100")))
