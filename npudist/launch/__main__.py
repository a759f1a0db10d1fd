"""`python -m npudist.launch ...` == `npurun ...`."""
from npudist.launch.main import main

if __name__ == "__main__":
    main()
