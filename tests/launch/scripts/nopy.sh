#!/bin/sh
# Non-Python worker for `npurun --no-python`.
echo "NOPY rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE args=$*"
