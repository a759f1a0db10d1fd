"""Module entrypoint for `npurun -m pkg_entry`."""
import os
import sys

print(f"MODULE rank={os.environ['RANK']} name={__name__} argv={sys.argv[1:]}", flush=True)
